# ruff: noqa: F811  (pytest fixtures imported from runtime_kit are test arguments of the same name)
"""The consumer runtime when handling goes wrong (streams/runtime/middleware/retry.py and the runner):
forgotten ids handled again, abandoned records left uncommitted, retries with backoff, dead letters with
their reason, refused events, and a service that cannot go on. Shared kit: runtime_kit.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import replace

import pytest

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import Unavailable
from agentstream.streams.core.events import (
    ClaimCheck,
    Event,
    InferenceCompleted,
    TaskSubmitted,
    ToolCallCompleted,
)
from agentstream.streams.core.signals import Abandoned
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.records import Context, RetryPolicy

from .runtime_kit import TOPIC, TP0, TP1, Handler, Service, backoffs, codec, kafka, produce, until  # noqa: F401  (fixtures, backoffs autouse; tests take them as arguments)


class Forgetter(Handler):
    """Tells the runtime to forget the event ids of the steps in ``forget`` (as the tool service does for
    a refused request)."""

    def __init__(self, *forget: str) -> None:
        super().__init__()
        self.forget = set(forget)

    async def act(self, event: Event, ctx: Context) -> None:
        if event.step_id in self.forget:
            ctx.forget()


async def test_a_forgotten_event_id_is_handled_again_when_it_comes_again(kafka, codec):
    """Event ids are predictable: a record refused for what it claims must not make a later record
    with the same id (the real one) a duplicate. Others are still dropped."""
    handler = Forgetter("a:0")
    produce(kafka, codec, 0, "a:0", "b:0", "a:0", "b:0")  # each step twice, with the same event id
    async with Service(kafka, codec, handler) as svc:
        await until(lambda: svc.runner.stats["processed"] == 3 and svc.runner.stats["duplicates"] == 1)
    assert handler.calls == Counter({"a:0": 2, "b:0": 1})
    assert kafka.committed == {TP0: 4}


async def test_an_abandoned_record_is_neither_committed_nor_dead_lettered(kafka, codec):
    handler = Handler()
    handler.fail["b:0"] = lambda n: Abandoned("partition 0 belongs to another member now") if n == 1 else None
    produce(kafka, codec, 0, "a:0", "b:0", "c:0")
    async with Service(kafka, codec, handler) as svc:
        await until(lambda: handler.ended("a:0", "c:0") and svc.runner.stats["abandoned"] == 1)
        await until(lambda: kafka.committed.get(TP0) == 1)
        assert svc.runner.tracker.in_flight == 1  # b:0: not done, left for the partition's owner
        await svc.consumer.rebalance({TP1})
        assert svc.runner.tracker.in_flight == 0
        assert max(kafka.commits_for(TP0)) == 1 and kafka.produced == []
        await svc.consumer.rebalance({TP0, TP1})  # as its next owner would: b:0 again, c:0 a duplicate
        await until(lambda: handler.ended("b:0") and svc.runner.stats["duplicates"] == 1)
    assert handler.calls["b:0"] == 2  # not retried here: once, then by the next owner
    assert svc.runner.stats["retries"] == 0 and svc.runner.stats["dead_lettered"] == 0
    assert kafka.committed[TP0] == 3


# -- retries and dead letters ------------------------------------------------------------------

async def test_a_retriable_error_is_retried_with_backoff(kafka, codec, backoffs):
    handler = Handler()
    handler.fail["r:0"] = lambda n: Unavailable("busy") if n <= 2 else None
    produce(kafka, codec, 0, "r:0")
    retry = RetryPolicy(max_attempts=4, backoff_s=0.001, max_backoff_s=0.002)
    async with Service(kafka, codec, handler, retry=retry) as svc:
        await until(lambda: handler.ended("r:0"))
    assert handler.calls["r:0"] == 3
    assert backoffs == [(1, 0.001, 0.002), (2, 0.001, 0.002)]
    assert (svc.runner.stats["retries"], svc.runner.stats["processed"], svc.runner.stats["dead_lettered"]) == (2, 1, 0)
    assert kafka.produced == [] and kafka.committed == {TP0: 1}


async def test_failed_records_go_to_the_dead_letter_topic_with_the_reason_and_the_service_carries_on(
        kafka, codec, backoffs):
    handler = Handler()
    handler.fail["a:0"] = lambda _n: Unavailable("still busy")  # retriable, every time
    handler.fail["b:0"] = lambda n: ValueError("bad payload") if n == 1 else None  # not retriable; fixed later
    produce(kafka, codec, 0, "a:0", "b:0")
    garbage = b"\x01not avro"
    kafka.append(TOPIC, 0, garbage, key=b"g")
    produce(kafka, codec, 0, "d:0")
    async with Service(kafka, codec, handler) as svc:  # max_attempts=3
        await until(lambda: handler.ended("d:0") and svc.runner.stats["dead_lettered"] == 3)
        await until(lambda: kafka.committed.get(TP0) == 4)
        assert not svc.runner.stopping
        # A re-driven copy of b:0 is handled: a dead-lettered event is not remembered as done.
        kafka.append(TOPIC, 0, kafka.logs[TP0][1].value, key=b"b")
        await until(lambda: handler.ended("b:0"))
    assert handler.calls == Counter({"a:0": 3, "b:0": 2, "d:0": 1})
    assert backoffs == [(1, 0.001, 0.002), (2, 0.001, 0.002)]  # a:0's retries; b:0 is not retried
    letters = sorted(svc.letters(), key=lambda letter: letter.source_offset)
    assert [(le.source_offset, le.error_kind, le.run_id) for le in letters] == [
        (0, "retries_exhausted", "a"), (1, "handler_error", "b"), (2, "undecodable", "g")]
    assert letters[0].reason == "Unavailable: still busy" and letters[1].reason == "ValueError: bad payload"
    assert "magic byte" in letters[2].reason
    assert [le.value for le in letters] == [kafka.logs[TP0][i].value for i in range(3)]
    assert all((le.consumer, le.source_topic, le.source_partition) == ("svc", TOPIC, 0) for le in letters)
    assert sorted((p.key, codec.decode(p.value).run_id) for p in kafka.produced) == [  # keyed by run
        (b"a", "a"), (b"b", "b"), (b"g", "g")]
    assert svc.runner.stats["duplicates"] == 0
    assert kafka.committed == {TP0: 5}


async def test_an_event_its_topic_does_not_carry_is_refused_and_its_id_not_remembered(kafka, codec):
    """Issue 37, finding 1: Kafka authorizes per topic, not per event type, so whoever may write a topic of
    the contract could publish another party's event there (a model reply on a tool-results topic). The
    runtime refuses it, and a forgery that borrowed a real event's id does not make the real one a
    duplicate."""
    topic = Topics.of(Settings(kafka_bootstrap="fake:1", database_url="unused")).tool_results
    real = ToolCallCompleted.build(run_id="r", step="r:1:tool", service="tools", tool="calculator", ok=True,
                                   result="2")
    forged_reply = InferenceCompleted.build(run_id="r", step="r:0:model", service="mallory",
                                            text='{"tool": "transfer"}', finish_reason="stop")
    borrowed = TaskSubmitted.build(run_id="r", step="r:task", service="mallory", task="x", max_steps=1)
    borrowed = replace(borrowed, event_id=real.event_id)
    claimed = ClaimCheck.build(run_id="r", step="r:0:model", service="mallory", event_type=InferenceCompleted.schema_name,
                               digest="0" * 64, size=1)
    for event in (forged_reply, borrowed, claimed, real):
        kafka.append(topic, 0, codec.encode(event), key=b"r")
    handler = Handler()
    async with Service(kafka, codec, handler, topics=[topic]) as svc:
        await until(lambda: handler.ended("r:1:tool") and svc.runner.stats["dead_lettered"] == 3)
    assert handler.calls == Counter({"r:1:tool": 1})
    letters = sorted(svc.letters(), key=lambda letter: letter.source_offset)
    assert [(le.source_offset, le.error_kind) for le in letters] == [(0, "refused"), (1, "refused"), (2, "refused")]
    assert letters[0].reason.startswith("InferenceCompleted is not an event of agent.tool.results")
    assert "claim check for InferenceCompleted" in letters[2].reason


async def test_a_service_that_cannot_go_on_fails_unready_and_leaves_its_record_uncommitted(kafka, codec):
    """``fail()`` + ``Abandoned`` (what the inference service does when its engine died): the service stops,
    ``run()`` raises the cause for the worker to exit non-zero, and the record is neither committed nor
    dead-lettered: the partition's next owner handles it."""
    handler = Handler()
    svc = Service(kafka, codec, handler)
    dead = RuntimeError("the engine is dead")

    def die(_n: int) -> BaseException:
        svc.runner.fail(dead)
        return Abandoned("the engine died")

    handler.fail["b:0"] = die
    produce(kafka, codec, 0, "a:0", "b:0")
    await svc.start()
    assert svc.task is not None
    with pytest.raises(RuntimeError, match="the engine is dead"):
        await asyncio.wait_for(svc.task, 5)
    assert svc.runner.stopping and svc.consumer.stopped
    assert kafka.committed == {TP0: 1} and svc.letters() == []
    assert handler.calls["b:0"] == 1  # not retried in this process


async def test_a_record_that_cannot_be_dead_lettered_stops_the_service_uncommitted(kafka, codec):
    handler = Handler()
    handler.fail["b:0"] = lambda _n: ValueError("bad payload")
    kafka.send_error = RuntimeError("the dead-letter topic is gone")
    produce(kafka, codec, 0, "a:0", "b:0", "c:0")
    svc = await Service(kafka, codec, handler).start()
    assert svc.task is not None
    with pytest.raises(RuntimeError, match="dead-letter topic is gone"):
        await asyncio.wait_for(svc.task, 5)
    assert svc.runner.stopping and svc.consumer.stopped
    assert kafka.committed == {TP0: 1}  # not past b:0, whatever became of c:0
