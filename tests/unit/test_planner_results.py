"""Results the planner cannot apply yet (services/planner/service.py, ``_on_result``): a result for a step
the run has not recorded is re-checked against the history, then put aside (``Deferred``) until the run's
next transition; handed over again, it is applied, or dropped if it is still ahead of the run."""

from __future__ import annotations

import pytest

from agentstream.streams.core.events import InferenceCompleted, TaskSubmitted, ToolCallCompleted
from agentstream.streams.core.signals import Deferred

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, names, settings

TOOL_CALL = '{"action":"tool","tool":"calculator","arguments":{"expression":"2+2"}}'


def task(run_id: str) -> TaskSubmitted:
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", task="What is 2 + 2?",
                               tools=["calculator"], max_steps=5)


def tool_result(step: str, run_id: str | None = None) -> ToolCallCompleted:
    return ToolCallCompleted.build(run_id=run_id or step.split(":")[0], step=step, service="tools",
                                   tool="calculator", ok=True, result="4")


async def rig() -> PlannerRig:
    r = PlannerRig(FakeKafka(), MemoryHistory(), settings())
    await r.take(0)
    return r


async def test_a_result_ahead_of_the_recorded_run_waits_for_the_transition_that_asks_for_it():
    r = await rig()
    await r.feed(task("r"))  # pending: the model, step 0
    early = tool_result("r:1:tool")  # answers step 1: its request went out, its transition is not recorded
    with pytest.raises(Deferred) as caught:
        await r.feed(early)
    ready = caught.value.ready
    assert ready is not None and not ready.done()
    assert r.planner.stats["rechecked"] == 1  # the cached state was re-read from the history first
    assert len(r.store.transitions) == 1  # nothing recorded for it
    reply = InferenceCompleted.build(run_id="r", step="r:0:model", service="inference", text=TOOL_CALL,
                                     finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    await r.feed(reply)  # the transition that requests step 1
    assert ready.done()
    await r.feed(early, deferrals=1)  # handed over again: now the pending step's result
    state = r.store.state("r")
    assert state.pending_step_id == "r:2:model" and "returned: 4" in state.messages[-1].content


async def test_a_result_for_a_run_never_recorded_is_put_aside_once_then_dropped():
    r = await rig()
    orphan = tool_result("ghost:3:tool")
    with pytest.raises(Deferred):
        await r.feed(orphan)
    await r.feed(orphan, deferrals=1)  # still nothing recorded: dropped, not deferred again
    assert r.store.runs == {} and r.kafka.produced == []


async def test_results_that_are_not_steps_of_the_run_are_never_put_aside():
    r = await rig()
    await r.feed(task("r"))
    mark = len(r.kafka.produced)
    await r.feed(tool_result("r:9:tool/sub"))  # a tool's own sub-request (not the planner's)
    await r.feed(tool_result("elsewhere:9:tool", run_id="r"))  # a step id that is not the run's
    assert r.kafka.produced[mark:] == [] and len(r.store.transitions) == 1
    assert names(r.sent()) == ["RetrievalRequested", "InferenceRequested"]


async def test_a_stale_cached_state_is_re_read_from_the_history_instead_of_putting_the_result_aside():
    r = await rig()
    await r.feed(task("r"))
    stale = r.planner.cache.get("r")
    reply = InferenceCompleted.build(run_id="r", step="r:0:model", service="inference", text=TOOL_CALL,
                                     finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    await r.feed(reply)
    assert stale is not None
    r.planner.cache.remember(stale)  # the cache is behind the history (what leases should rule out)
    await r.feed(tool_result("r:1:tool"))  # applied at once: no Deferred
    assert r.planner.stats["rechecked"] == 1 and r.store.state("r").pending_step_id == "r:2:model"
