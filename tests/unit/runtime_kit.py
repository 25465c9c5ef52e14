"""What the consumer runtime's unit tests share (test_runtime.py, test_runtime_failures.py): an in-memory
consumer and producer (fakes.py), fixtures, a recording handler and a service to drive."""


from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import TopicPartition

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import (
    DeadLetter,
    Event,
    TaskSubmitted,
)
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.runtime import failures, publisher, records, runner
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, RetryPolicy, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner

from .fakes import FakeConsumer, FakeKafka

TOPIC = "t.in"
TP0 = TopicPartition(TOPIC, 0)
TP1 = TopicPartition(TOPIC, 1)


@pytest.fixture(scope="module")
def codec() -> Codec:
    return Codec(LocalRegistry())


@pytest.fixture
def kafka(monkeypatch: pytest.MonkeyPatch) -> FakeKafka:
    """Two partitions; the runtime's consumer and producer are the fake's."""
    kafka = FakeKafka(partitions=2)
    monkeypatch.setattr(runner, "AIOKafkaConsumer", kafka.consumer)
    monkeypatch.setattr(publisher, "AIOKafkaProducer", kafka.producer)
    return kafka


@pytest.fixture(autouse=True)
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, float, float]]:
    """Every backoff the runtime asks for, as ``(attempt, base_s, cap_s)``; each waits 1 ms, no jitter.
    (Retries wait ``RetryPolicy.delay``, outage rounds ``PartitionHolds.sleep``.)"""
    calls: list[tuple[int, float, float]] = []

    def backoff(attempt: int, *, base_s: float, cap_s: float) -> float:
        calls.append((attempt, base_s, cap_s))
        return 0.001

    monkeypatch.setattr(records, "backoff", backoff)
    monkeypatch.setattr(failures, "backoff", backoff)
    return calls


def task(step: str) -> TaskSubmitted:
    """An event of run ``step``'s prefix ("a:0" is run "a"), with ``step`` as its step id."""
    return TaskSubmitted.build(run_id=step.split(":")[0], step=step, service="test", task=step, max_steps=1)


def produce(kafka: FakeKafka, codec: Codec, partition: int, *steps: str) -> None:
    for step in steps:
        event = task(step)
        kafka.append(TOPIC, partition, codec.encode(event), key=event.run_id.encode())


async def until(condition: Callable[[], object], what: str = "the condition") -> None:
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


class Handler:
    """Logs ``start``/``end``/``cancelled`` per step; a step waits for its gate (if any), then raises
    what ``fail[step](call number)`` returns (if anything)."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.calls: Counter[str] = Counter()
        self.gates: dict[str, asyncio.Event] = {}
        self.fail: dict[str, Callable[[int], BaseException | None]] = {}
        self.active = self.peak = 0

    def gate(self, *steps: str) -> asyncio.Event:
        event = asyncio.Event()
        for step in steps:
            self.gates[step] = event
        return event

    def started(self, step: str) -> bool:
        return f"start {step}" in self.log

    def ended(self, *steps: str) -> bool:
        return all(f"end {step}" in self.log for step in steps)

    def for_key(self, key: str) -> list[str]:
        return [entry for entry in self.log if entry.split()[1].startswith(key + ":")]

    async def __call__(self, event: Event, ctx: Context) -> None:
        step = event.step_id
        self.calls[step] += 1
        self.log.append(f"start {step}")
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            gate = self.gates.get(step)
            if gate is not None:
                await gate.wait()
            error = self.fail[step](self.calls[step]) if step in self.fail else None
            if error is not None:
                raise error
            await self.act(event, ctx)
        except asyncio.CancelledError:
            self.log.append(f"cancelled {step}")
            raise
        finally:
            self.active -= 1
        self.log.append(f"end {step}")

    async def act(self, event: Event, ctx: Context) -> None:
        """What a successful call does besides logging (subclasses emit)."""


class Service:
    """A ServiceRunner on the fake broker, running from ``start()`` to ``stop()``."""

    def __init__(self, kafka: FakeKafka, codec: Codec, handler: Handler, *, runner_kw: dict[str, Any] | None = None,
                 **config: Any) -> None:
        settings = Settings(kafka_bootstrap="fake:1", database_url="unused", partitions=kafka.partitions)
        self.runtime = Runtime(settings, codec, tracing=None)
        cfg = {"name": "svc", "topics": [TOPIC], "group_id": "svc", "commit_interval_s": 0.001,
               "shutdown_grace_s": 0.5, "outage_backoff_s": 0.003,
               "retry": RetryPolicy(max_attempts=3, backoff_s=0.001, max_backoff_s=0.002), **config}
        self.runner = ServiceRunner(self.runtime, ServiceConfig(**cfg), handler, **(runner_kw or {}))
        self.kafka = kafka
        self.task: asyncio.Task | None = None

    @property
    def consumer(self) -> FakeConsumer:
        return self.kafka.consumers[-1]

    async def start(self) -> Service:
        self.task = asyncio.create_task(self.runner.run())
        await self.runner.wait_joined(5)
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.runner.stop()
        await asyncio.wait_for(self.task, 5)

    async def __aenter__(self) -> Service:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        if self.task is not None and not self.task.done():
            await self.stop()

    def letters(self) -> list[DeadLetter]:
        """The dead letters sent, in order."""
        out = [self.runtime.codec.decode(p.value) for p in self.kafka.produced if p.topic == self.runtime.topics.dlq]
        assert all(isinstance(letter, DeadLetter) for letter in out)
        return out  # type: ignore[return-value]


# -- ordering and concurrency ------------------------------------------------------------------
