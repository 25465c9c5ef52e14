"""Consumer lag, sampled: per assigned partition, the end offset minus the group's committed offset.

Sampled every ``sample_interval_s`` (two requests per service: ListOffsets for the ends, OffsetFetch for
the committed positions), never per message. Each worker reports the partitions assigned to its own
members, so summing over workers gives a group's lag without double counting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options

if TYPE_CHECKING:
    from agentstream.streams.runtime.runner import ServiceRunner
    from agentstream.streams.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class GroupOffsets:
    """Committed and end offsets, through one admin client and one group-less consumer."""

    def __init__(self, bootstrap: str, client_id: str, *, auth: KafkaAuth) -> None:
        self.bootstrap = bootstrap
        self.auth = auth
        self.client_id = client_id
        self.admin: AIOKafkaAdminClient | None = None
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        if self.admin is None:
            self.admin = AIOKafkaAdminClient(**kafka_options(self.bootstrap, self.auth), client_id=self.client_id)
            await self.admin.start()
            self.consumer = AIOKafkaConsumer(**kafka_options(self.bootstrap, self.auth), enable_auto_commit=False,
                                             auto_offset_reset="earliest", isolation_level="read_committed",
                                             fetch_max_wait_ms=50, client_id=self.client_id)
            await self.consumer.start()

    async def stop(self) -> None:
        if self.consumer is not None:
            await self.consumer.stop()
        if self.admin is not None:
            await self.admin.close()
        self.admin = self.consumer = None

    async def positions(self, group: str, tps: Sequence[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        """(committed, end) per partition; a partition the group never committed counts from its start."""
        assert self.admin is not None and self.consumer is not None
        if not tps:
            return {}
        committed = await self.admin.list_consumer_group_offsets(group, partitions=list(tps))
        ends = await self.consumer.end_offsets(list(tps))
        missing = [tp for tp in tps if committed.get(tp) is None or committed[tp].offset < 0]
        starts = await self.consumer.beginning_offsets(missing) if missing else {}
        out = {}
        for tp in tps:
            meta = committed.get(tp)
            position = meta.offset if meta is not None and meta.offset >= 0 else starts.get(tp, 0)
            out[tp] = (position, ends[tp])
        return out


class LagSampler:
    """Sets ``agentstream_consumer_lag{service,topic,partition}`` for the runners' assigned partitions."""

    def __init__(self, offsets: GroupOffsets, runners: Sequence[ServiceRunner], metrics: Metrics) -> None:
        self.offsets = offsets
        self.runners = runners
        self.metrics = metrics
        self._labels: set[tuple[str, str, str]] = set()

    async def sample(self) -> dict[tuple[str, str, int], int]:
        """One sample; returns the lag per (service, topic, partition)."""
        lags: dict[tuple[str, str, int], int] = {}
        for runner in self.runners:
            consumer = runner.consumer
            if consumer is None:
                continue
            tps = sorted(consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
            for tp, (committed, end) in (await self.offsets.positions(runner.config.group_id, tps)).items():
                lags[(runner.config.name, tp.topic, tp.partition)] = max(0, end - committed)
        labels = set()
        for (service, topic, partition), lag in lags.items():
            key = (service, topic, str(partition))
            labels.add(key)
            self.metrics.lag.labels(*key).set(lag)
        for gone in self._labels - labels:  # revoked: not ours to report any more
            with contextlib.suppress(KeyError):
                self.metrics.lag.remove(*gone)
        self._labels = labels
        return lags


async def sample_forever(name: str, sample: Callable[[], Awaitable[object]], interval_s: float,
                         stop: asyncio.Event) -> None:
    """Call ``sample()`` every ``interval_s`` until ``stop``; a failed sample is logged, not fatal."""
    while not stop.is_set():
        try:
            await sample()
        except (TimeoutError, KafkaError, OSError) as exc:
            log.warning("%s sample failed: %s", name, exc)
        except Exception:
            log.exception("%s sample failed", name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


__all__ = ["GroupOffsets", "LagSampler", "sample_forever"]
