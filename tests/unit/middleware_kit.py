"""What the middleware tests share: a delivery of one event, a chain's end that records what reached it,
a dead-letter stand-in, and a runtime on an in-memory producer (tests/unit/fakes.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiokafka import TopicPartition

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import Event, TaskSubmitted
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.runtime.middleware.chain import Delivery
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Record

from .fakes import FakeKafka

TOPIC = "t.in"
CODEC = Codec(LocalRegistry())
STATS_KEYS = ("processed", "dead_lettered", "duplicates", "retries", "outage_retries", "routed", "abandoned",
              "deferred")


def task(step: str = "r:0", **overrides: Any) -> TaskSubmitted:
    """An event of run ``step``'s prefix ("r:0" is run "r")."""
    return TaskSubmitted.build(run_id=step.split(":")[0], step=step, service="test", task=step, max_steps=1,
                               **overrides)


def delivery(event: Event | None = None, *, value: bytes | None = None, key: bytes | None = b"r",
             partition: int = 0, offset: int = 7, headers: dict[str, bytes] | None = None,
             decoded: bool = True, topic: str = TOPIC) -> Delivery:
    """A delivery of ``event`` (encoded as its value), decoded already unless ``decoded=False``."""
    event = event if event is not None else task()
    record = Record(topic=topic, partition=partition, offset=offset, key=key,
                    timestamp_ms=int(time.time() * 1000) - 5, headers=dict(headers or {}),
                    consumed_at=datetime.now(UTC))
    return Delivery(tp=TopicPartition(topic, partition), record=record,
                    value=value if value is not None else CODEC.encode(event), started=time.perf_counter(),
                    queue_wait=0.005, decoded=event if decoded else None)


def stats() -> dict[str, int]:
    return dict.fromkeys(STATS_KEYS, 0)


class End:
    """The end of a chain: records each delivery that reached it; ``fail(n)`` may return an error to raise
    on the n-th call."""

    def __init__(self, fail: Callable[[int], BaseException | None] | None = None) -> None:
        self.calls: list[Delivery] = []
        self.fail = fail

    async def __call__(self, delivery: Delivery) -> None:
        self.calls.append(delivery)
        error = self.fail(len(self.calls)) if self.fail is not None else None
        if error is not None:
            raise error


class Letters:
    """Stands in for ``Rejector``: the dead letters asked for, as (offset, kind, reason, run_id)."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, str, str, str | None]] = []

    async def __call__(self, record: Record, value: bytes | None, kind: str, reason: str,
                       run_id: str | None = None) -> None:
        self.sent.append((record.offset, kind, reason, run_id))


async def runtime(kafka: FakeKafka | None = None, **options: Any) -> Runtime:
    """A ``Runtime`` whose producer is ``kafka``'s (a fresh one by default); telemetry off unless given."""
    kafka = kafka or FakeKafka()
    settings = Settings(kafka_bootstrap="fake:1", database_url="unused", partitions=4)
    rt = Runtime(settings, CODEC, **{"tracing": None, "stages": None, **options})
    await rt.producer.stop()  # never started: closes it
    rt.producer = kafka.producer()  # type: ignore[assignment]
    return rt
