"""What the consumer loop does with a record that cannot go on now or ever: hold its partition while a
dependency it needs is away (``PartitionHolds``), or send it to the dead-letter topic (``Rejector``).
Shared by the decode step and the retry policy (``middleware/decode.py``, ``middleware/retry.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING

from aiokafka import TopicPartition

from agentstream.streams.core.kinds import DeadLetterKind
from agentstream.streams.core.outages import Outage, Outages, backoff
from agentstream.streams.runtime.dead_letters import Rejected, publish_dead_letter
from agentstream.streams.runtime.records import Probe, Record, ServiceConfig

if TYPE_CHECKING:  # prometheus-client is the [worker] extra
    from agentstream.streams.runtime.publisher import Runtime
    from agentstream.streams.telemetry.metrics import ServiceMetrics


class PartitionHolds:
    """The outages a service's records wait out now, and the partitions they hold: a held partition is
    paused by the fetch loop (``ServiceRunner``) and readiness reports the outage (``outages``).

    ``probes``: how to tell whether a dependency answers again, by name (the runner's dict, shared, so
    that a probe added later is seen)."""

    def __init__(self, config: ServiceConfig, probes: dict[str, Probe]) -> None:
        self.outages = Outages()
        self.probes = probes
        #: Partitions whose records wait for a dependency: how many records each.
        self.held: dict[TopicPartition, int] = {}
        self._base_s = config.retry.backoff_s
        self._cap_s = config.outage_backoff_s

    def hold(self, tp: TopicPartition, dependency: str, exc: BaseException) -> Outage:
        """A record of ``tp`` starts waiting for ``dependency``: readiness reports it, the partition is held."""
        self.held[tp] = self.held.get(tp, 0) + 1
        return self.outages.begin(dependency, exc)

    def release(self, tp: TopicPartition, outage: Outage) -> None:
        """That record waits no more (done, or dead-lettered)."""
        self.outages.end(outage)
        held = self.held.pop(tp, 1) - 1
        if held > 0:
            self.held[tp] = held

    async def sleep(self, rounds: int) -> None:
        """One round of waiting (capped exponential backoff, up to ``ServiceConfig.outage_backoff_s``)."""
        await asyncio.sleep(backoff(rounds, base_s=self._base_s, cap_s=self._cap_s))

    async def wait_out(self, dependency: str, rounds: int) -> bool:
        """Sleep one round of an outage; then True when the dependency's probe answers — the failure was
        then the record's own, and counts as an attempt — else False (never on the first round)."""
        await self.sleep(rounds)
        probe = self.probes.get(dependency)
        if probe is None or rounds < 2:
            return False
        try:
            await asyncio.wait_for(probe(), self._cap_s)
        except Exception:
            return False
        return True


class Rejector:
    """Sends a record to the dead-letter topic and counts it. The letter is built to fit
    (``dead_letters.py``: a prefix of a value too large, with its size and digest) and its publish waits
    out a broker outage, so a big or poisonous record never stops the service; an error from here means
    the dead-letter topic itself is gone, and the runner stops rather than commit past the record."""

    def __init__(self, runtime: Runtime, service: str, stats: MutableMapping[str, int],
                 metrics: ServiceMetrics | None,
                 on_rejected: Callable[[Record, str, str], Awaitable[None]] | None = None) -> None:
        self.runtime = runtime
        self.service = service
        self.stats = stats
        self.metrics = metrics
        self.on_rejected = on_rejected

    async def __call__(self, record: Record, value: bytes | None, kind: DeadLetterKind, reason: str,
                       run_id: str | None = None) -> None:
        if run_id is None:
            run_id = record.key.decode(errors="replace") if record.key else ""
        await publish_dead_letter(self.runtime, Rejected(
            run_id=run_id, step=f"dlq:{record.topic}:{record.partition}:{record.offset}",
            service=self.service, consumer=self.service, source_topic=record.topic,
            source_partition=record.partition, source_offset=record.offset, key=record.key, value=value,
            headers=record.headers, error_kind=kind, reason=reason))
        self.stats["dead_lettered"] += 1
        if self.metrics is not None:
            self.metrics.dead_letter(kind).inc()
        if self.on_rejected is not None:
            await self.on_rejected(record, kind, reason)


__all__ = ["PartitionHolds", "Rejector"]
