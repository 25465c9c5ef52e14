"""Replay for debugging, the parts a client needs: a run's timeline from PostgreSQL and Kafka (``timeline``;
its data in ``records``, the cross-check against Kafka in ``kafka_check``) and per-step comparison of two
runs (``diff``). Re-execution, the HTML timeline and the CLI are the application's (``agentstream.replay``).
See docs/replay.md."""
