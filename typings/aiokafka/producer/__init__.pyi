from aiokafka.producer.producer import AIOKafkaProducer as AIOKafkaProducer
