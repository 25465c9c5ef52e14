"""A producer that aiokafka has given up on is replaced (streams/runtime/publisher.py, ``DEAD_PRODUCER_ERRORS``).

Found by the chaos suite on the secure three-node cluster: after a leader moved, a batch came back with
OUT_OF_ORDER_SEQUENCE_NUMBER, aiokafka's sender stopped, and every later send of that process failed with
the same error until its handlers' retries ran out and dead-lettered live traffic. The fakes here stand
in for aiokafka's producer only to make it fail on cue; the cluster run is ``bench/chaos/chaos.py --secure``.
"""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaTimeoutError, OutOfOrderSequenceNumber

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.runtime.publisher import Runtime

from .middleware_kit import CODEC


class DyingProducer:
    """Acknowledges ``good`` records, then fails every pending and later one with ``error`` (as aiokafka's
    sender does once it stops)."""

    def __init__(self, good: int, error: BaseException | None) -> None:
        self.good, self.error = good, error
        self.sent: list[bytes] = []
        self.stopped = False
        self.dead = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    async def send(self, topic: str, value: bytes, **_: object) -> asyncio.Future:
        if self.dead:
            raise self.error  # type: ignore[misc]
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        if len(self.sent) < self.good or self.error is None:
            self.sent.append(value)
            future.set_result(len(self.sent))
        else:
            self.dead = True
            future.set_exception(self.error)
        return future


class ScriptedRuntime(Runtime):
    def __init__(self, producers: list[DyingProducer]) -> None:
        self.script = producers
        super().__init__(Settings(kafka_bootstrap="fake:1", database_url="unused", partitions=4), CODEC,
                         tracing=None, stages=None)

    def _new_producer(self):  # type: ignore[override]
        return self.script.pop(0)


def _task(n: int) -> TaskSubmitted:
    return TaskSubmitted.build(run_id=f"run-{n}", step=f"run-{n}:task", service="test", task="t", max_steps=4)


async def _send(rt: Runtime, n: int) -> object:
    return await (await rt.send(rt.topics.tasks, _task(n)))


async def test_a_producer_that_died_on_out_of_order_sequence_is_replaced_once() -> None:
    first, second = DyingProducer(1, OutOfOrderSequenceNumber()), DyingProducer(0, None)
    rt = ScriptedRuntime([first, second])
    await rt.start()
    assert await _send(rt, 1) == 1
    with pytest.raises(OutOfOrderSequenceNumber):
        await _send(rt, 2)          # the record is failed: its handler's retry sends it again
    with pytest.raises(OutOfOrderSequenceNumber):
        await _send(rt, 3)          # sent before the renewal began: the dead producer refuses it
    assert await _send(rt, 4) == 1  # the successor
    assert rt.producer is second and rt.producer_renewals == 1 and first.stopped
    await rt.stop()


async def test_other_errors_keep_the_producer() -> None:
    first = DyingProducer(0, KafkaTimeoutError())
    rt = ScriptedRuntime([first])
    await rt.start()
    with pytest.raises(KafkaTimeoutError):
        await _send(rt, 1)
    await asyncio.sleep(0)
    assert rt.producer is first and rt.producer_renewals == 0
    await rt.stop()
