"""Follow ``agent.outcomes``: who needs to know the moment a run ends.

One consumer, no group, over every partition, starting at the partitions' end offsets when it
starts: clients waiting for answers, and the inference service, which aborts a generation whose run
has already ended (cancelled, past its deadline, failed elsewhere).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import RunCompleted, RunFailed
from agentstream.streams.core.kinds import RunOutcome
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.consumer_stop import stop_consumer
from agentstream.streams.telemetry import stages

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    """How a run ended, as ``AgentClient.wait`` returns it.

    ``status`` is ``completed`` (with the ``answer``) or ``failed`` (with ``error_code``, e.g.
    ``cancelled`` or ``deadline_exceeded``, and a readable ``error``); ``steps`` and ``duration_ms`` are
    the planner's count. Built from the run's ``RunCompleted`` or ``RunFailed`` on ``agent.outcomes``,
    so that a client learns the outcome from Kafka, without the database. ``output``: for a task with an
    ``output_schema``, the answer parsed from JSON (it matches the schema; ``answer`` holds its text);
    None otherwise.
    """

    run_id: str
    status: RunOutcome
    answer: str | None
    error_code: str | None
    error: str | None
    steps: int
    duration_ms: float
    output: Any = None

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    @classmethod
    def of(cls, event: RunCompleted | RunFailed) -> RunResult:
        if isinstance(event, RunCompleted):
            return cls(event.run_id, "completed", event.answer, None, None, event.steps, event.duration_ms,
                       parse_output(event.output))
        return cls(event.run_id, "failed", None, event.error_code, event.error, event.steps, event.duration_ms)


def parse_output(text: str | None) -> Any:
    """A run's structured output (``RunCompleted.output``, JSON text) as a Python value; None without one.
    Text that does not parse (written by something other than the planner, which validated it) is kept as
    the string it is rather than failing the reader."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


class OutcomeWatcher:
    """Calls ``on_outcome`` with every run outcome published after ``start()`` returned."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, codec: Codec,
                 on_outcome: Callable[[RunResult], None], *, request_timeout_ms: int = 10_000,
                 auth: KafkaAuth) -> None:
        self.topic = topic
        self.partitions = partitions
        self.codec = codec
        self.on_outcome = on_outcome
        self.consumer = AIOKafkaConsumer(**kafka_options(bootstrap, auth), enable_auto_commit=False,
                                         isolation_level="read_committed", fetch_max_wait_ms=100,
                                         request_timeout_ms=request_timeout_ms)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        self.consumer.assign(tps)
        ends = await self.consumer.end_offsets(tps)
        for tp in tps:
            self.consumer.seek(tp, ends[tp])
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        clock = stages.clock()
        while True:
            batch = await self.consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                for msg in messages:
                    if clock is not None:
                        clock.add("outcomes.deliver", time.time() - msg.timestamp / 1000)
                    try:
                        event = await self.codec.decode_async(msg.value)
                    except DecodeError:
                        continue
                    if isinstance(event, (RunCompleted, RunFailed)):
                        try:
                            self.on_outcome(RunResult.of(event))
                        except Exception:
                            log.exception("outcome callback failed for %s", event.run_id)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await stop_consumer(self.consumer, "outcome watcher")
