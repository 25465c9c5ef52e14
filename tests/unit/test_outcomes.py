"""The client's outcome watcher (streams/client/outcomes.py) over an in-memory broker (agentstream.testing).

What is proved here, with no Kafka: only outcomes published after ``start()`` returned are reported,
from every partition; a ``RunCompleted`` becomes a successful ``RunResult`` with the answer, a
``RunFailed`` one with the error code; records that do not decode and other events are skipped; a
callback that raises does not stop the watcher; ``stop()`` ends the loop and stops the consumer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from agentstream.streams.client.outcomes import OutcomeWatcher, RunResult
from agentstream.streams.core.events import RunCompleted, RunFailed, TaskSubmitted
from agentstream.testing import InMemoryBroker


def completed(run_id: str, answer: str = "4") -> RunCompleted:
    return RunCompleted.build(run_id=run_id, step=f"{run_id}:outcome", service="planner", answer=answer, steps=2,
                              duration_ms=12.5)


def failed(run_id: str) -> RunFailed:
    return RunFailed.build(run_id=run_id, step=f"{run_id}:outcome", service="planner", error_code="deadline",
                           error="past its deadline", steps=1, duration_ms=30.0)


async def until(condition: Callable[[], object], what: str) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
async def broker():
    async with InMemoryBroker() as broker:
        yield broker


async def watching(broker: InMemoryBroker, on_outcome: Callable[[RunResult], None]) -> OutcomeWatcher:
    """A started watcher whose consumer is the broker's."""
    topics = broker.topics
    watcher = OutcomeWatcher("in-memory:9092", topics.outcomes, broker.partitions(topics.outcomes), broker.codec,
                             on_outcome, auth=broker.settings.kafka_auth)
    await watcher.consumer.stop()  # the aiokafka consumer it made, never started
    watcher.consumer = broker.consumer()
    await watcher.start()
    return watcher


async def test_outcomes_after_start_are_reported_from_every_partition(broker):
    topic = broker.topics.outcomes
    broker.publish(topic, completed("run-before"))  # published before start: not this watcher's
    seen: list[RunResult] = []
    watcher = await watching(broker, seen.append)
    try:
        runs = [f"run-{i}" for i in range(12)]
        for run_id in runs:
            broker.publish(topic, completed(run_id, answer=run_id.upper()))
        assert len({r.partition for r in broker.records(topic)}) > 1  # the runs hash to several partitions
        await until(lambda: len(seen) == len(runs), "every outcome")
        assert sorted(r.run_id for r in seen) == sorted(runs)
        assert all(r.ok and r.answer == r.run_id.upper() and r.steps == 2 for r in seen)
    finally:
        await watcher.stop()


async def test_a_failed_run_is_a_result_with_its_error_and_other_records_are_skipped(broker):
    topic = broker.topics.outcomes
    seen: list[RunResult] = []
    watcher = await watching(broker, seen.append)
    try:
        broker.append(topic, b"not an event", key=b"run-x", partition=0)
        broker.publish(topic, TaskSubmitted.build(run_id="run-t", step="run-t:task", service="client", task="t",
                                                  max_steps=1), partition=0)
        broker.publish(topic, failed("run-f"), partition=0)
        await until(lambda: seen, "the failure")
        await asyncio.sleep(0.01)
        assert seen == [RunResult("run-f", "failed", None, "deadline", "past its deadline", 1, 30.0)]
        assert not seen[0].ok
    finally:
        await watcher.stop()


async def test_a_callback_that_raises_does_not_stop_the_watcher(broker, caplog):
    topic = broker.topics.outcomes
    seen: list[str] = []

    def callback(result: RunResult) -> None:
        seen.append(result.run_id)
        if result.run_id == "run-bad":
            raise RuntimeError("the caller's bug")

    watcher = await watching(broker, callback)
    try:
        broker.publish(topic, completed("run-bad"), partition=0)
        broker.publish(topic, completed("run-good"), partition=0)
        await until(lambda: "run-good" in seen, "the outcome after the failing callback")
        assert seen == ["run-bad", "run-good"]
        assert "outcome callback failed for run-bad" in caplog.text
    finally:
        await watcher.stop()


async def test_stop_ends_the_loop_and_stops_the_consumer(broker):
    seen: list[RunResult] = []
    watcher = await watching(broker, seen.append)
    consumer = watcher.consumer
    await watcher.stop()
    assert consumer.stopped and watcher._task is not None and watcher._task.done()
    broker.publish(broker.topics.outcomes, completed("run-late"))
    await asyncio.sleep(0.01)
    assert seen == []
