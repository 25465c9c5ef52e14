"""Sub-agents and handoffs on the in-memory planner (services/planner/subagents.py): a call to another
agent starts a child run derived from the step, once; the child's outcome comes back as the step's
result; several children run at once; a parent that ends stops its children; a handoff switches the
run's definition; a session goes on with the agent its conversation was handed to."""

from __future__ import annotations

import json

from agentstream import Agent
from agentstream.services.planner import subagents
from agentstream.services.planner.transcript import Turn
from agentstream.streams.core.events import (
    InferenceCompleted,
    InferenceRequested,
    RunCancelRequested,
    RunCompleted,
    RunFailed,
    TaskSubmitted,
    ToolCallCompleted,
    ToolCallRequested,
)

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, settings
from .test_agents_admission import MemoryAgents

RESEARCH = Agent(name="research", description="Finds facts.", system_prompt="You research.", tools=["calculator"])
BILLING = Agent(name="billing", description="Answers billing questions.", system_prompt="You do billing.",
                tools=["calculator"], max_steps=5)
TRIAGE = Agent(name="triage", system_prompt="You triage.", calls=["research"], handoffs=["billing"], max_steps=6)


async def rig(**changes) -> PlannerRig:
    r = PlannerRig(FakeKafka(), MemoryHistory(), settings(**changes), agents=MemoryAgents(RESEARCH, BILLING, TRIAGE))
    await r.take(0)
    return r


def task(run_id: str, agent: str = "triage", **kw) -> TaskSubmitted:
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", task="Why was I charged twice?",
                               max_steps=8, agent=agent, **kw)


def reply(run_id: str, step: str, action: dict) -> InferenceCompleted:
    return InferenceCompleted.build(run_id=run_id, step=step, service="inference", text=json.dumps(action),
                                    finish_reason="stop")


def call(*tasks: str) -> dict:
    calls = [{"tool": "agent__research", "arguments": {"task": t}} for t in tasks]
    return ({"action": "tool", **calls[0]} if len(calls) == 1 else {"action": "tools", "calls": calls})


def answer(text: str) -> dict:
    return {"action": "final_answer", "answer": text}


async def test_the_model_sees_the_agents_it_may_call_and_hand_over_to_as_tools():
    r = await rig()
    await r.feed(task("p"))
    state = r.store.state("p")
    assert state.subagents == ("research@1",) and state.handoffs == ("billing@1",)
    assert state.tools == ("agent__research", "handoff__billing")
    [request] = [e for e in r.sent() if isinstance(e, InferenceRequested)]
    assert "agent__research" in request.messages[0].content and "Finds facts." in request.messages[0].content
    assert "handoff__billing" in (request.response_schema or "")


async def test_a_sub_agent_call_starts_a_child_once_and_its_outcome_is_the_steps_result():
    r = await rig()
    await r.feed(task("p", deadline=None))
    mark = len(r.kafka.produced)
    await r.feed(reply("p", "p:0:model", call("find the two charges")))
    [child_task] = [e for e in r.sent(since=mark) if isinstance(e, TaskSubmitted)]
    child = subagents.child_run_id("p:1:tool")
    assert (child_task.run_id, child_task.agent, child_task.parent_run_id, child_task.parent_step_id,
            child_task.depth, child_task.task) == (child, "research@1", "p", "p:1:tool", 1, "find the two charges")
    assert not [e for e in r.sent(since=mark) if isinstance(e, ToolCallRequested)]  # no tool service involved
    [row] = [s for t in r.store.transitions for s in t.steps_requested if s.step_id == "p:1:tool"]
    assert row.run_id == "p" and row.request["child_run_id"] == child  # the parent's step, in the history

    await r.feed(child_task)
    await r.feed(child_task)  # a copy (a redelivery, a republished request): the same run, nothing new
    state = r.store.state(child)
    assert (state.agent, state.parent_run_id, state.depth, state.status) == ("research@1", "p", 1, "running")
    asked = {e.event_id for e in r.sent(since=mark) if isinstance(e, InferenceRequested) and e.run_id == child}
    assert len(asked) == 1  # (republished at most, with the same id: consumers drop the copy)

    mark = len(r.kafka.produced)
    await r.feed(reply(child, f"{child}:0:model", answer("two charges: 10 and 10")))
    done, result = [e for e in r.sent(since=mark) if isinstance(e, (RunCompleted, ToolCallCompleted))]
    assert isinstance(done, RunCompleted) and done.run_id == child
    assert isinstance(result, ToolCallCompleted) and (result.run_id, result.step_id, result.ok, result.result) == (
        "p", "p:1:tool", True, "two charges: 10 and 10")
    await r.feed(result)
    parent = r.store.state("p")
    assert parent.messages[-1].content == "agent__research returned: two charges: 10 and 10"
    assert parent.pending_step_id == "p:2:model"


async def test_several_children_run_at_once_and_a_failed_child_is_an_error_result():
    r = await rig()
    await r.feed(task("p"))
    mark = len(r.kafka.produced)
    await r.feed(reply("p", "p:0:model", call("first", "second")))
    children = [e for e in r.sent(since=mark) if isinstance(e, TaskSubmitted)]
    assert [c.parent_step_id for c in children] == ["p:1:tool", "p:2:tool"] and len({c.run_id for c in children}) == 2
    for child in children:
        await r.feed(child)
    first, second = (c.run_id for c in children)
    await r.feed(reply(first, f"{first}:0:model", answer("one")))
    await r.feed(RunCancelRequested.build(run_id=second, step=f"{second}:cancel", service="client", reason="no"))
    results = [e for e in r.sent(since=mark) if isinstance(e, ToolCallCompleted)]
    assert [(e.step_id, e.ok) for e in results] == [("p:1:tool", True), ("p:2:tool", False)]
    assert "cancelled" in (results[1].error or "")
    for result in results:
        await r.feed(result)
    contents = [m.content for m in r.store.state("p").messages[-2:]]
    assert contents[0] == "agent__research returned: one" and contents[1].startswith("agent__research failed:")


async def test_a_parent_that_ends_stops_its_running_children():
    r = await rig()
    await r.feed(task("p"))
    await r.feed(reply("p", "p:0:model", call("slow work")))
    child = subagents.child_run_id("p:1:tool")
    mark = len(r.kafka.produced)
    await r.feed(RunCancelRequested.build(run_id="p", step="p:cancel", service="client", reason="enough"))
    stops = [e for e in r.sent(since=mark) if isinstance(e, RunCancelRequested)]
    assert [(e.run_id, e.requested_by) for e in stops] == [(child, "parent:p")]
    assert [e.run_id for e in r.sent(since=mark) if isinstance(e, RunFailed)] == ["p"]


async def test_a_run_at_the_depth_limit_is_not_offered_the_agents_it_could_call_and_deeper_is_refused():
    r = await rig(max_agent_depth=1)
    await r.feed(task("c", depth=1, parent_run_id="x"))
    assert r.store.state("c").subagents == () and "agent__research" not in r.store.state("c").tools
    await r.feed(task("d", depth=2, parent_run_id="x"))
    state = r.store.state("d")
    assert (state.status, state.error_code) == ("failed", "invalid_task") and "AGENTSTREAM_MAX_AGENT_DEPTH" in state.error


async def test_a_handoff_switches_the_runs_definition_and_the_new_agent_answers():
    r = await rig()
    await r.feed(task("p"))
    mark = len(r.kafka.produced)
    await r.feed(reply("p", "p:0:model", {"action": "tool", "tool": "handoff__billing", "arguments": {}}))
    state = r.store.state("p")
    assert (state.agent, state.handed_from, state.tools, state.subagents) == ("billing@1", "triage@1", ("calculator",), ())
    assert state.messages[0].content.startswith("You do billing.") or "You do billing." in state.messages[0].content
    assert state.messages[-1].content == "the conversation was handed over to billing@1"
    [request] = [e for e in r.sent(since=mark) if isinstance(e, InferenceRequested)]
    assert request.step_id == "p:1:model" and "You do billing." in request.messages[0].content
    assert not [e for e in r.sent(since=mark) if isinstance(e, ToolCallRequested)]
    await r.feed(reply("p", "p:1:model", answer("refunded")))
    assert r.store.state("p").answer == "refunded"


def test_a_turn_that_was_handed_over_remembers_both_agents_and_reads_back():
    turn = Turn.of("t", "hi", "{}", "ok", agent="billing@1", handed_from="triage@1")
    assert Turn.from_dict(turn.to_dict()) == turn and turn.to_dict()["handed_from"] == "triage@1"
    plain = Turn.of("t", "hi", "{}", "ok", agent="triage@1")
    assert "agent" not in plain.to_dict() and plain.agent is None  # only a handed-over turn records it


def test_the_html_timeline_draws_each_childs_run_under_its_parents_step():
    from datetime import UTC, datetime

    from agentstream.streams.replay.html import render
    from agentstream.streams.replay.records import Step, Timeline

    now = datetime(2026, 12, 6, tzinfo=UTC)

    def timeline(run_id: str, steps: list[Step]) -> Timeline:
        run = {"run_id": run_id, "status": "completed", "task": "t", "step_count": len(steps), "answer": "a",
               "error_code": None, "error": None, "submitted_at": now, "updated_at": now, "finished_at": now,
               "replay_of": None}
        return Timeline(run=run, steps=steps, events=[])  # type: ignore[arg-type]

    call = Step(index=1, kind="tool", step_id="p:1:tool", status="completed", result={"ok": True, "result": "x"},
                request={"agent": "research@1", "task": "look", "child_run_id": "run-child"}, error=None,
                requested_at=now, completed_at=now)
    page = render(timeline("p", [call]), {1: (timeline("run-child", []), {})})
    assert page.count("<h1>") == 2 and "step 1 ran a sub-agent" in page and "research@1: look (run run-child)" in page
    assert render(timeline("p", [call])).count("<h1>") == 1  # no tree given: the run alone
