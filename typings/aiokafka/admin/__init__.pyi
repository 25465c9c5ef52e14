from aiokafka.admin.client import AIOKafkaAdminClient as AIOKafkaAdminClient
from aiokafka.admin.new_partitions import NewPartitions as NewPartitions
from aiokafka.admin.new_topic import NewTopic as NewTopic
from aiokafka.admin.records_to_delete import RecordsToDelete as RecordsToDelete
