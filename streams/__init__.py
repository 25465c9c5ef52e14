"""agentstream's shared streaming layer: events, topics, codecs, the consumer runtime, client, replay."""

from agentstream.streams.kafka_metadata import disable_auto_topic_creation

# Before any aiokafka client exists: asking for a topic's metadata must never create the topic.
disable_auto_topic_creation()

__all__: list[str] = []
