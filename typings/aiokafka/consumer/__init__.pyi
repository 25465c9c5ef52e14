from aiokafka.consumer.consumer import AIOKafkaConsumer as AIOKafkaConsumer
