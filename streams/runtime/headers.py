"""The Kafka headers the runtime itself writes (docs/contract.md lists them all, with the telemetry ones).

Names only, so that the contract (``agentstream/ops/asyncapi.py``), the publisher and the consumer loop
agree on them without importing each other.
"""

from __future__ import annotations

#: On every event the runtime publishes: the event's type (its class name), readable without decoding.
TYPE_HEADER = "agentstream-type"
#: Set on every event emitted while handling a record: "topic:partition:offset:appended_ms:consumed_us"
#: of that record (appended: the Kafka record timestamp), so the planner can record where and when the
#: request it answers was sent and consumed.
SOURCE_HEADER = "agentstream-source"
#: On a record the runtime forwarded to its run's partition: "topic:partition:offset" it came from.
ROUTED_HEADER = "agentstream-routed-from"

#: On a task that is a turn of a session: the session id (UTF-8). The planner handles a session's tasks in
#: their order on the partition, each after the one before has been admitted (``ServiceConfig.order_keys``);
#: without it, in the order their handling reaches the session (the same, unless one is retried).
SESSION_HEADER = "agentstream-session"

__all__ = ["ROUTED_HEADER", "SESSION_HEADER", "SOURCE_HEADER", "TYPE_HEADER"]
