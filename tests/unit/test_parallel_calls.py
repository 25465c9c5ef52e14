"""Parallel tool calls (services/planner/fanout.py): the ``tools`` action, the fan-out of one reply's calls
in one transition, the fan-in once every result (or error, or denial) is back, per-call approval, and the
tool service's check of each call against the pending set — all in memory."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from agentstream.services.planner import fanout, machine, publishing
from agentstream.services.planner.state import PendingCall, RunState, ToolBatch, ToolRequest
from agentstream.streams.core.actions import CallRequest, action_schema, instructions, parse_action
from agentstream.streams.core.errors import ActionError
from agentstream.streams.core.events import (
    ApprovalDecided,
    InferenceCompleted,
    InferenceRequested,
    TaskSubmitted,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import ToolHarness
from agentstream.testing.database import ToolCallRow

from .fakes import FakeKafka
from .planner_fakes import MemoryHistory, PlannerRig, names, settings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TOPICS = Topics()
CALC = ToolInfo("calculator", "Evaluate arithmetic.",
                {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]})
WIRE = ToolInfo("wire_money", "Send money.", {"type": "object", "properties": {"amount": {"type": "number"}}},
                requires_approval=True)


def _calls(*pairs: tuple[str, dict]) -> str:
    return json.dumps({"action": "tools", "calls": [{"tool": t, "arguments": a} for t, a in pairs]})


THREE = _calls(("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"}),
               ("calculator", {"expression": "3+3"}))


def _task(**kw) -> TaskSubmitted:
    payload = {"task": "Add these up", "tools": ["calculator"], "max_steps": 8, "prefetch": False, **kw}
    return TaskSubmitted.build(run_id="r", step="r:task", service="client", created_at=NOW, **payload)


def _start(tools: list[ToolInfo] | None = None, limit: int = 4, **kw) -> RunState:
    tools = tools or [CALC]
    return machine.start(_task(tools=[t.name for t in tools], **kw), tools, NOW, max_parallel_calls=limit)


def _reply(state: RunState, text: str) -> InferenceCompleted:
    return InferenceCompleted.build(run_id="r", step=state.pending_step_id, service="inference", text=text,
                                    finish_reason="stop", prompt_tokens=10, completion_tokens=5)


def _result(step: str, value: str, tool: str = "calculator", **kw) -> ToolCallCompleted:
    return ToolCallCompleted.build(run_id="r", step=step, service="tools", tool=tool, ok=True, result=value, **kw)


def _requests(state: RunState, **kw) -> list[ToolCallRequested]:
    return [e for _, e in machine.outputs(state, TOPICS, **kw) if isinstance(e, ToolCallRequested)]


# -- the action ---------------------------------------------------------------------------------------

def test_the_tools_action_parses_in_order_and_one_call_is_the_tool_action():
    action = parse_action("Let me do both: " + THREE)
    assert action.kind == "tools"
    assert action.calls == (CallRequest("calculator", {"expression": "1+1"}),
                            CallRequest("calculator", {"expression": "2+2"}),
                            CallRequest("calculator", {"expression": "3+3"}))
    single = parse_action(_calls(("calculator", {"expression": "1+1"})))
    assert (single.kind, single.tool, single.arguments, single.calls) == ("tool", "calculator", {"expression": "1+1"}, ())


@pytest.mark.parametrize(("text", "problem"), [
    ('{"action": "tools", "calls": []}', "non-empty list"),
    ('{"action": "tools"}', "non-empty list"),
    ('{"action": "tools", "calls": [1, 2]}', "call 1"),
    ('{"action": "tools", "calls": [{"tool": "a"}, {"arguments": {}}]}', "call 2"),
    ('{"action": "tools", "calls": [{"tool": "a", "arguments": []}, {"tool": "b"}]}', "call 1"),
])
def test_a_malformed_tools_action_says_which_call_is_wrong(text, problem):
    with pytest.raises(ActionError, match=problem):
        parse_action(text)


def test_the_schema_and_instructions_offer_several_calls_only_when_the_run_may_make_them():
    branches = action_schema([CALC], max_calls=3)["anyOf"]
    assert [b["properties"]["action"]["const"] for b in branches] == ["tool", "tools", "retrieve", "final_answer"]
    calls = branches[1]["properties"]["calls"]
    assert (calls["minItems"], calls["maxItems"]) == (2, 3)
    assert [c["properties"]["tool"] for c in calls["items"]["anyOf"]] == [{"const": "calculator"}]
    assert "tools" not in [b["properties"]["action"]["const"] for b in action_schema([CALC])["anyOf"]]
    assert '"action": "tools"' in instructions([CALC], max_calls=3) and "up to 3" in instructions([CALC], max_calls=3)
    assert '"tools"' not in instructions([CALC])
    assert json.loads(_start(limit=3).response_schema or "")["anyOf"][1] == branches[1]


# -- fan-out and fan-in -------------------------------------------------------------------------------

def test_a_reply_with_three_calls_fans_out_in_one_transition_and_fans_in_when_all_are_back():
    state = _start()
    out = machine.advance(state, _reply(state, THREE), NOW)
    assert (out.status, out.pending_kind, out.pending_step_id, out.step_index) == ("running", "tools", "r:1:tools", 4)
    sent = _requests(out)
    assert [(c.step_id, json.loads(c.arguments)) for c in sent] == [
        ("r:1:tool", {"expression": "1+1"}), ("r:2:tool", {"expression": "2+2"}), ("r:3:tool", {"expression": "3+3"})]
    assert {c.parent_step_id for c in sent} == {"r:0:model"}
    assert machine.outputs(out, TOPICS) == machine.outputs(out, TOPICS)  # deterministic: same ids on a republish

    # Results come back in any order; nothing goes to the model until the last one.
    second = machine.advance(out, _result("r:2:tool", "4"), NOW)
    assert second.pending_kind == "tools" and second.status == "running" and _requests(second) == []
    assert not machine.is_pending_result(second, _result("r:2:tool", "4"))  # a copy of an applied result
    assert machine.is_pending_result(second, _result("r:3:tool", "6"))
    assert not machine.is_pending_result(second, _result("r:9:tool", "6"))
    third = machine.advance(second, _result("r:3:tool", "6"), NOW)
    done = machine.advance(third, _result("r:1:tool", "2"), NOW)
    assert (done.pending_kind, done.pending_step_id, done.step_index) == ("model", "r:4:model", 5)
    assert [m.content for m in done.messages[-3:]] == [
        "calculator returned: 2", "calculator returned: 4", "calculator returned: 6"]  # in call order
    assert done.messages[-4].role == "assistant" and done.messages[-4].content == THREE
    (_, request), _ = machine.outputs(done, TOPICS)
    assert isinstance(request, InferenceRequested) and request.parent_step_id == "r:1:tool"


def test_a_stalled_fan_out_is_re_driven_with_every_call_still_unanswered():
    state = _start()
    out = machine.advance(state, _reply(state, THREE), NOW)
    partial = machine.advance(out, _result("r:2:tool", "4"), NOW)
    assert [c.step_id for c in _requests(partial, redrive=True)] == ["r:1:tool", "r:3:tool"]
    assert _requests(partial, redrive=True) == [c for c in _requests(out) if c.step_id != "r:2:tool"]  # same ids


def test_an_error_result_is_one_calls_answer_unless_the_run_fails_on_tool_errors():
    failed = ToolCallCompleted.build(run_id="r", step="r:1:tool", service="tools", tool="calculator", ok=False,
                                     error="failed after 3 attempts", error_kind="retries_exhausted")
    state = _start()
    out = machine.advance(machine.advance(state, _reply(state, THREE), NOW), failed, NOW)
    assert out.status == "running" and out.pending_kind == "tools"
    for step, value in (("r:2:tool", "4"), ("r:3:tool", "6")):
        out = machine.advance(out, _result(step, value), NOW)
    assert out.messages[-3].content == "calculator failed: failed after 3 attempts"

    strict = _start(on_tool_error="fail_run")
    strict = machine.advance(machine.advance(strict, _reply(strict, THREE), NOW), failed, NOW)
    assert (strict.status, strict.error_code) == ("failed", "tool_failed")


def test_too_many_calls_or_a_tool_the_run_may_not_use_is_refused_and_nothing_runs():
    state = _start(limit=2)
    over = machine.advance(state, _reply(state, THREE), NOW)
    assert over.pending_kind == "model" and over.parse_failures == 1
    assert "3 tool calls in one reply; at most 2 at once" in over.messages[-1].content
    one_at_a_time = _start(limit=1)
    refused = machine.advance(one_at_a_time, _reply(one_at_a_time, THREE), NOW)
    assert refused.pending_kind == "model" and "one tool call per reply" in refused.messages[-1].content

    mixed = _calls(("calculator", {"expression": "1+1"}), ("shell", {"cmd": "rm -rf /"}))
    other = machine.advance(state, _reply(state, mixed), NOW)
    assert other.pending_kind == "model" and other.parse_failures == 0 and _requests(other) == []
    assert "'shell' is not available" in other.messages[-1].content
    assert "none of the calls was made" in other.messages[-1].content


def test_a_fan_out_needs_a_step_per_call():
    state = _start(max_steps=3)
    out = machine.advance(state, _reply(state, THREE), NOW)
    assert (out.status, out.error_code) == ("failed", "max_steps")
    assert "3 tool calls with 2 of the run's 3 steps left" in (out.error or "")


# -- approval per call --------------------------------------------------------------------------------

def _decision(step: str, ok: bool) -> ApprovalDecided:
    return ApprovalDecided.build(run_id="r", step=step, service="client", approved=ok, reason="too much",
                                 decided_by="ana")


def test_a_call_that_needs_approval_holds_only_itself_and_the_fan_in():
    state = _start([CALC, WIRE])
    reply = _calls(("wire_money", {"amount": 5}), ("calculator", {"expression": "2+2"}))
    out = machine.advance(state, _reply(state, reply), NOW)
    assert out.status == "running" and [c.step_id for c in _requests(out)] == ["r:2:tool"]  # the other runs
    assert machine.decide(out, _decision("r:2:tool", True), NOW) is None  # it needs no decision
    waiting = machine.advance(out, _result("r:2:tool", "4"), NOW)
    assert waiting.status == "awaiting_approval" and waiting.pending_kind == "tools" and _requests(waiting) == []

    approved = machine.decide(waiting, _decision("r:1:tool", True), NOW)
    assert approved is not None and approved.status == "running"
    (call,) = _requests(approved)
    assert (call.step_id, call.tool) == ("r:1:tool", "wire_money")
    batch = fanout.batch_of(approved)
    assert batch is not None and batch.calls[0].approved_by == "ana"
    assert machine.decide(approved, _decision("r:1:tool", False), NOW) is None  # decided already
    done = machine.advance(approved, _result("r:1:tool", "sent", tool="wire_money"), NOW)
    assert done.pending_kind == "model" and [m.content for m in done.messages[-2:]] == [
        "wire_money returned: sent", "calculator returned: 4"]

    denied = machine.decide(out, _decision("r:1:tool", False), NOW)  # before the other call is back
    assert denied is not None and denied.status == "running" and denied.pending_kind == "tools"
    assert _requests(denied) == []
    denied = machine.advance(denied, _result("r:2:tool", "4"), NOW)
    assert denied.messages[-2].content == "the call to wire_money was denied by a person: too much"


def test_a_fan_out_of_calls_that_all_need_approval_sends_nothing_until_decided():
    state = _start([WIRE])
    reply = _calls(("wire_money", {"amount": 5}), ("wire_money", {"amount": 6}))
    out = machine.advance(state, _reply(state, reply), NOW)
    assert out.status == "awaiting_approval" and _requests(out) == []
    rows = publishing.transition(state, out, machine.outputs(out, TOPICS), None, None, TOPICS, None).steps_requested  # type: ignore[arg-type]
    assert [(r.step_id, r.step_index, r.kind, r.request["awaiting_approval"], r.request["parallel"]) for r in rows] == [
        ("r:1:tool", 1, "tool", True, {"call": 0, "calls": 2}), ("r:2:tool", 2, "tool", True, {"call": 1, "calls": 2})]


# -- the stored state ---------------------------------------------------------------------------------

def test_a_fan_out_state_round_trips_and_a_single_call_still_reads_as_before():
    state = _start([CALC, WIRE])
    out = machine.advance(state, _reply(state, _calls(("wire_money", {"amount": 5}), ("calculator", {}))), NOW)
    out = machine.advance(out, _result("r:2:tool", "4"), NOW)
    raw = out.to_json()
    assert RunState.from_json(raw) == out and RunState.from_json(raw).to_json() == raw
    stored = json.loads(raw)["pending_request"]
    assert stored == {"asked_by": "r:0:model", "send": [], "calls": [
        {"step_id": "r:1:tool", "tool": "wire_money", "arguments": {"amount": 5}, "awaiting_approval": True},
        {"step_id": "r:2:tool", "tool": "calculator", "arguments": {}, "content": "calculator returned: 4",
         "done": True}]}
    old = json.loads(raw) | {"pending_kind": "tool", "pending_request": {"tool": "calculator", "arguments": {}}}
    old.pop("max_parallel_calls")  # a state recorded before parallel calls
    assert RunState.from_json(json.dumps(old)).pending_request == ToolRequest(tool="calculator", arguments={})
    assert RunState.from_json(json.dumps(old)).max_parallel_calls == 1
    assert ToolBatch.from_dict(stored).calls[1] == PendingCall(step_id="r:2:tool", tool="calculator", arguments={},
                                                               done=True, content="calculator returned: 4")


# -- the planner: one transition, keys, republishing --------------------------------------------------

async def test_the_planner_publishes_the_fan_out_keyed_by_call_and_republishes_it_for_a_redelivered_reply():
    rig = PlannerRig(FakeKafka(), MemoryHistory(), settings(max_parallel_tool_calls=4))
    await rig.take(0)
    task = TaskSubmitted.build(run_id="r", step="r:task", service="client", task="Add", tools=["calculator"],
                               max_steps=8, prefetch=False)
    await rig.feed(task)
    reply = InferenceCompleted.build(run_id="r", step="r:0:model", service="inference", text=THREE,
                                     finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    mark = len(rig.kafka.produced)
    await rig.feed(reply)
    calls = [p for p in rig.kafka.produced[mark:] if p.topic == rig.topics.tool_requests]
    assert [p.key for p in calls] == [b"r:1:tool", b"r:2:tool", b"r:3:tool"]  # side by side in the tool service
    (transition,) = rig.store.transitions[-1:]
    assert [(s.step_id, s.step_index, s.request["parallel"]) for s in transition.steps_requested] == [
        ("r:1:tool", 1, {"call": 0, "calls": 3}), ("r:2:tool", 2, {"call": 1, "calls": 3}),
        ("r:3:tool", 3, {"call": 2, "calls": 3})]

    mark = len(rig.kafka.produced)
    await rig.feed(reply)  # redelivered (a crash before its offset was committed): the same requests again
    assert names(rig.sent(since=mark)) == ["ToolCallRequested"] * 3
    await rig.feed(_result("r:1:tool", "2"))
    mark = len(rig.kafka.produced)
    await rig.feed(_result("r:1:tool", "2"))  # a copy of the result: republishes that transition's (nothing)
    await rig.feed(reply)  # no longer the event applied last: dropped
    assert names(rig.sent(since=mark)) == []
    for step, value in (("r:3:tool", "6"), ("r:2:tool", "4")):
        await rig.feed(_result(step, value))
    state = rig.store.state("r")
    assert state.pending_step_id == "r:4:model" and len(rig.store.transitions) == 5


# -- the tool service: any call of the pending set, each once ------------------------------------------

async def test_the_tool_service_runs_each_call_of_the_pending_set_once():
    from agentstream.services.tools.builtin import calculator

    async with ToolHarness([calculator]) as harness:
        calls = [harness.request("calculator", {"expression": f"{i}+{i}"}, run_id="r", index=i) for i in (1, 2, 3)]
        harness.database.expect_fanout(calls, done=["r:3:tool"])
        for call in calls[:2]:
            result = (await harness.deliver(call)).one(ToolCallCompleted)
            assert result.ok and result.step_id == call.step_id
        assert (await harness.deliver(calls[2])).of(ToolCallCompleted) == []  # answered already: refused
        forged = harness.request("calculator", {"expression": "9*9"}, run_id="r", index=2)
        assert (await harness.deliver(forged)).of(ToolCallCompleted) == []  # not as the run asked


async def test_a_call_of_the_fan_out_waiting_for_a_person_is_not_run():
    from agentstream.services.tools.registry import tool

    ran: list[str] = []

    @tool(requires_approval=True)
    async def wire(amount: int) -> str:
        ran.append(f"wire {amount}")
        return "sent"

    async with ToolHarness([wire]) as harness:
        calls = [harness.request("wire", {"amount": i}, run_id="r", index=i) for i in (1, 2)]
        run = harness.database.expect_fanout(calls, awaiting=["r:1:tool"], approval_tools=["wire"])
        handled = await harness.deliver(calls[0])
        assert handled.of(ToolCallCompleted) == [] and ran == []
        assert (await harness.deliver(calls[1])).of(ToolCallCompleted) == []  # needs approval, has none
        assert run.state is not None
        run.state["pending_request"]["calls"][1]["approved_by"] = "ana"
        assert (await harness.deliver(calls[1])).one(ToolCallCompleted).ok and ran == ["wire 2"]
        assert harness.database.tool_calls["r:2:tool"] == ToolCallRow("r:2:tool", "r", "wire", {"amount": 2},
                                                                      status="succeeded", result="sent")


# -- the timeline and replay diff: the calls side by side ----------------------------------------------

def _step(index: int, kind: str, request: dict, result: dict | None = None, **times: datetime):
    from agentstream.streams.replay.records import Step

    return Step(index=index, kind=kind, step_id=f"r:{index}:{kind}", status="completed", request=request,
                result=result, error=None, requested_at=NOW, completed_at=NOW, **times)


def test_the_timeline_shows_the_calls_side_by_side_and_counts_only_the_longest_on_the_chain():
    from datetime import timedelta

    from agentstream.streams.replay.records import Timeline

    def at(ms: float) -> datetime:
        return NOW + timedelta(milliseconds=ms)

    calls = [_step(1 + k, "tool", {"tool": "calculator", "arguments": {}, "parallel": {"call": k, "calls": 3}},
                   sent_at=at(10), picked_at=at(11), done_at=at(11 + ms), result_sent_at=at(11 + ms),
                   returned_at=at(12 + ms))
             for k, ms in enumerate((200, 50, 100))]
    assert [s.label for s in calls] == ["#1 tool ∥ 1/3", "#2 tool ∥ 2/3", "#3 tool ∥ 3/3"]
    run = {"run_id": "r", "status": "completed", "task": "t", "step_count": 4, "answer": "a", "error_code": None,
           "error": None, "submitted_at": NOW, "updated_at": at(300), "finished_at": at(300), "replay_of": None}
    timeline = Timeline(run=run, steps=calls, events=[])  # type: ignore[arg-type]
    assert timeline.budget().compute_ms == 200  # the slowest call, not the sum of the three
    assert {(sp.step, sp.row) for sp in timeline.spans() if sp.kind == "compute"} == {(1, (0, 3)), (2, (1, 3)),
                                                                                       (3, (2, 3))}


def test_replay_diff_aligns_the_calls_and_says_which_were_made_together():
    from agentstream.streams.replay.diff import diff_runs

    def model(index: int, text: str) -> dict:
        return {"index": index, "kind": "model", "status": "completed", "request": {}, "result": {"text": text},
                "error": None}

    def call(index: int, expression: str, parallel: dict | None) -> dict:
        request = {"tool": "calculator", "arguments": {"expression": expression}}
        return {"index": index, "kind": "tool", "status": "completed", "error": None,
                "request": {**request, "parallel": parallel} if parallel else request,
                "result": {"tool": "calculator", "ok": True, "result": "2"}}

    both = _calls(("calculator", {"expression": "1+1"}), ("calculator", {"expression": "2+2"}))
    side_by_side = {"run_id": "a", "status": "completed", "answer": "x", "steps": [
        model(0, both), call(1, "1+1", {"call": 0, "calls": 2}), call(2, "2+2", {"call": 1, "calls": 2})]}
    one_by_one = {"run_id": "b", "status": "completed", "answer": "x", "steps": [
        model(0, json.dumps({"action": "tool", "tool": "calculator", "arguments": {"expression": "1+1"}})),
        call(1, "1+1", None), model(2, "{}")]}
    d = diff_runs(side_by_side, side_by_side)
    assert not d.decisions_changed and d.steps[0].decision_a == (
        '→ tools calculator {"expression":"1+1"} ∥ calculator {"expression":"2+2"}')
    d = diff_runs(side_by_side, one_by_one)
    assert d.changed_steps == [0, 2] and "call 1 of 2 → alone" in d.steps[1].notes


def test_the_instructions_show_example_arguments_for_nullable_and_untyped_parameters():
    tool = ToolInfo(name="lookup", description="Finds things.", parameters={"type": "object", "properties": {
        "query": {"type": ["string", "null"]}, "limit": {"type": ["null", "integer"]}, "anything": {}}})
    text = instructions([tool])  # a zod-made schema's nullable types ("type": [...]) once broke this
    assert '"query": "text"' in text and '"limit": 1' in text and '"anything": "value"' in text
