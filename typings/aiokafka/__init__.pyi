from aiokafka.abc import ConsumerRebalanceListener as ConsumerRebalanceListener
from aiokafka.client import AIOKafkaClient as AIOKafkaClient
from aiokafka.consumer import AIOKafkaConsumer as AIOKafkaConsumer
from aiokafka.errors import ConsumerStoppedError as ConsumerStoppedError
from aiokafka.errors import IllegalOperation as IllegalOperation
from aiokafka.producer import AIOKafkaProducer as AIOKafkaProducer
from aiokafka.structs import ConsumerRecord as ConsumerRecord
from aiokafka.structs import OffsetAndMetadata as OffsetAndMetadata
from aiokafka.structs import OffsetAndTimestamp as OffsetAndTimestamp
from aiokafka.structs import TopicPartition as TopicPartition

__version__: str
