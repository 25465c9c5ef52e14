"""Fencing and take-over (services/planner/leases.py) with two planners of one group on an in-memory broker
and history: a planner whose partition was taken over records and publishes nothing more, a stalled one
re-checks its lease before publishing, and a take-over loads the partition's active runs and keeps a cached
run only if nobody else held its partition meanwhile."""

from __future__ import annotations

import time

import pytest

from agentstream.streams.core.events import InferenceCompleted, TaskSubmitted
from agentstream.streams.core.signals import Fenced

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, names, run_ids, settings

TOOL_CALL = '{"action":"tool","tool":"calculator","arguments":{"expression":"2+2"}}'


def task(run_id: str, **kw) -> TaskSubmitted:
    payload = {"task": "What is 2 + 2?", "tools": ["calculator"], "max_steps": 5, **kw}
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", **payload)


def reply(step: str, text: str = TOOL_CALL) -> InferenceCompleted:
    return InferenceCompleted.build(run_id=step.split(":")[0], step=step, service="inference", text=text,
                                    finish_reason="stop", prompt_tokens=10, completion_tokens=5)


def pair(partitions: int = 1) -> tuple[PlannerRig, PlannerRig]:
    """Two planners of one group: one broker, one history."""
    kafka, store = FakeKafka(), MemoryHistory()
    return (PlannerRig(kafka, store, settings(partitions=partitions)),
            PlannerRig(kafka, store, settings(partitions=partitions)))


async def test_a_planner_whose_partition_was_taken_over_cannot_record_and_lets_go_of_it():
    a, b = pair()
    await a.take(0)
    await a.feed(task("r"))
    await b.take(0)  # a new epoch: a paused past its session timeout, say
    mark = len(a.kafka.produced)
    with pytest.raises(Fenced):
        await a.feed(reply("r:0:model"))
    assert a.sent(since=mark) == []  # the tool call waits for the record, which was refused
    assert a.store.runs["r"].version == 1 and a.planner.stats["fenced"] == 1
    assert 0 not in a.planner.leases.held and "r" not in a.planner.cache  # forgotten until reassigned
    await b.feed(reply("r:0:model"))  # the partition's owner now records the same result
    assert b.store.state("r").pending_step_id == "r:1:tool" and names(b.sent(since=mark)) == ["ToolCallRequested"]


async def test_a_stalled_planner_checks_its_lease_before_publishing_anything():
    a, b = pair()
    await a.take(0)
    a.planner.leases.ticked(time.monotonic() + 60, slack=0.25)  # the timer saw the process stall
    await a.feed(task("still-mine"))  # the lease is still current: business as usual
    assert a.store.state("still-mine").status == "running" and a.planner.stats["fenced"] == 0
    await b.take(0)
    a.planner.leases.ticked(time.monotonic() + 120, slack=0.25)  # stalled again, and lost it meanwhile
    mark = len(a.kafka.produced)
    with pytest.raises(Fenced):
        await a.feed(task("lost"))
    assert a.kafka.produced[mark:] == []  # not even the requests that go out before the record
    assert "lost" not in a.store.runs and a.planner.stats["fenced"] == 1


async def test_an_event_of_a_partition_not_assigned_is_fenced_before_anything_goes_out():
    a, _ = pair(partitions=2)
    await a.take(0)
    (elsewhere,) = run_ids(a.topics, 1)
    with pytest.raises(Fenced, match="not assigned"):
        await a.feed(task(elsewhere))
    assert a.kafka.produced == [] and a.store.runs == {}


async def test_a_take_over_leases_the_partition_and_loads_its_active_runs():
    a, b = pair(partitions=2)
    await a.take(0, 1)
    (x, done), (y,) = run_ids(a.topics, 0, 2), run_ids(a.topics, 1)
    await a.feed(task(x))
    await a.feed(task(y))
    await a.feed(task(done, max_steps=0))  # invalid: failed at once
    await a.revoke(1)
    await b.take(1)
    assert b.store.epochs[("", 1)] == 2 and b.store.epochs[("", 0)] == 1
    assert y in b.planner.cache and x not in b.planner.cache and done not in b.planner.cache
    assert b.planner.assigned == {1}


async def test_a_cached_run_survives_a_rebalance_only_if_nobody_else_held_its_partition():
    a, b = pair()
    await a.take(0)
    await a.feed(task("r"))
    cached = a.planner.cache.get("r")
    await a.revoke(0)
    await a.take(0)  # straight back: epoch 2, right after a's own 1
    assert a.planner.cache.get("r") is cached
    await a.revoke(0)
    await b.take(0)  # b held it meanwhile (epoch 3) and moved the run on
    await b.feed(reply("r:0:model"))
    await b.revoke(0)
    await a.take(0)  # epoch 4: a's cached state may be stale, and is
    again = a.planner.cache.get("r")
    assert again is not None and again.version == 2 and again.pending_step_id == "r:1:tool"
