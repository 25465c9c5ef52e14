"""The consumer runtime every service runs on: decode, de-duplicate, handle, publish, commit; offsets that
finish out of order; dead letters. Knows Kafka and events, never an agent rule."""
