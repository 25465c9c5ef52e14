"""agentstream's shared streaming layer: events, topics, codecs, the consumer runtime, client, replay."""

__all__: list[str] = []
