"""The consumer runtime every service runs on: decode, de-duplicate, handle, publish, commit; offsets that
finish out of order; dead letters. Knows Kafka and events, never an agent rule.

``publisher.Runtime`` (the producer side a process shares), ``records`` (what a handler gets: ``Record``,
``Context``; ``ServiceConfig``), ``runner.ServiceRunner`` (the consumer loop, a facade over the
``middleware`` chain), ``headers``, ``offsets``, ``failures`` and ``dead_letters``."""
