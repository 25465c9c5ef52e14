"""Route by run (``ServiceConfig.route_by_run``, the planner): a service that joins topics by run must
see all of a run's events on one partition. An event that arrived on another partition than its run's,
or not keyed by its run id (a third-party producer with another partitioner: librdkafka's default is
CRC32, Kafka's murmur2), is forwarded there, not handled.

``RouteByRun`` (before tracing: a forwarded record has no span) marks such a record; ``Forward`` (inside
``Recover``, so a failed forward is retried and dead-lettered as a handler's failure would be) sends it
and ends its trip there.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping

from agentstream.streams.runtime.headers import ROUTED_HEADER
from agentstream.streams.runtime.middleware.chain import Delivery, Next
from agentstream.streams.runtime.publisher import Runtime

log = logging.getLogger(__name__)


class RouteByRun:
    def __init__(self, runtime: Runtime) -> None:
        self.topics = runtime.topics

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        record, run_id = delivery.record, delivery.event.run_id
        delivery.misrouted = (record.partition != self.topics.partition_for(run_id)
                              or record.key != run_id.encode())
        await call_next(delivery)


class Forward:
    def __init__(self, service: str, runtime: Runtime, stats: MutableMapping[str, int]) -> None:
        self.service = service
        self.runtime = runtime
        self.stats = stats

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        if delivery.misrouted:
            await self.forward(delivery)
        else:
            await call_next(delivery)

    async def forward(self, delivery: Delivery) -> None:
        """Forward the record to its run's partition of the same topic, unchanged but for its key (the
        run id) and an ``agentstream-routed-from`` header; the copy there is handled by the partition's
        owner, with the run's other events. The record is done once the copy is acknowledged; a
        redelivered original is forwarded again, and the copy dropped as a duplicate by the run's owner
        (same event id; a task's run id starts its run once)."""
        record, event = delivery.record, delivery.event
        partition = self.runtime.topics.partition_for(event.run_id)
        headers = [(k, v) for k, v in record.headers.items() if k != ROUTED_HEADER]
        headers.append((ROUTED_HEADER, f"{record.topic}:{record.partition}:{record.offset}".encode()))
        await (await self.runtime.producer.send(record.topic, delivery.value, key=event.run_id.encode(),
                                                partition=partition, headers=headers))
        self.stats["routed"] += 1
        log.info("%s: %s of %s arrived on %s[%d]@%d (key %r), forwarded to partition %d keyed by its run id",
                 self.service, type(event).__name__, event.run_id, record.topic, record.partition,
                 record.offset, record.key, partition)


__all__ = ["Forward", "RouteByRun"]
