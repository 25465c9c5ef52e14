"""The planner's state machine, as pure functions (no broker, no database)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from agentstream.services.planner import machine
from agentstream.services.planner.state import PrefetchServed, RetrievalRequest, RunState
from agentstream.streams.core.events import (
    ApprovalDecided,
    InferenceCompleted,
    InferenceRequested,
    Passage,
    RetrievalCompleted,
    RetrievalRequested,
    RunCompleted,
    RunFailed,
    TaskSubmitted,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.topics import Topics

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
TOPICS = Topics()
CALC = ToolInfo("calculator", "Evaluate arithmetic.",
                {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]})


def _task(**kw) -> TaskSubmitted:
    defaults = dict(task="What is 2 + 2?", tools=["calculator"], max_steps=5)
    defaults.update(kw)
    return TaskSubmitted.build(run_id="r", step="r:task", service="client", created_at=NOW, **defaults)


def _reply(state: RunState, text: str) -> InferenceCompleted:
    return InferenceCompleted.build(run_id="r", step=state.pending_step_id, service="inference", text=text,
                                    finish_reason="stop", prompt_tokens=10, completion_tokens=5)


def test_start_asks_the_model_with_the_action_schema_and_tools():
    state = machine.start(_task(), [CALC], NOW)
    assert (state.status, state.pending_kind, state.pending_step_id, state.step_index) == ("running", "model", "r:0:model", 1)
    (prefetch_topic, prefetch), (topic, request), (snap_topic, snapshot) = machine.outputs(state, TOPICS)
    assert prefetch_topic == TOPICS.retrieval_requests and prefetch.step_id == "r:prefetch"
    assert prefetch.query == "What is 2 + 2?"  # the speculative retrieval starts with the model call
    assert topic == TOPICS.inference_requests and isinstance(request, InferenceRequested)
    branches = json.loads(request.response_schema)["anyOf"]
    assert [b["properties"]["action"]["const"] for b in branches] == ["tool", "retrieve", "final_answer"]
    assert branches[0]["properties"]["tool"] == {"const": "calculator"}  # only the run's own tools
    assert "calculator" in request.messages[0].content and request.messages[1].content == "What is 2 + 2?"
    assert snap_topic == TOPICS.runs and snapshot.version == state.version


def test_model_tool_model_answer():
    state = machine.start(_task(prefetch=False), [CALC], NOW)
    state = machine.advance(state, _reply(state, '{"action":"tool","tool":"calculator","arguments":{"expression":"2+2"}}'), NOW)
    assert state.pending_kind == "tool" and state.pending_step_id == "r:1:tool"
    (_, request), _ = machine.outputs(state, TOPICS)
    assert isinstance(request, ToolCallRequested) and json.loads(request.arguments) == {"expression": "2+2"}
    assert request.parent_step_id == "r:0:model"
    result = ToolCallCompleted.build(run_id="r", step="r:1:tool", service="tools", tool="calculator", ok=True, result="4")
    assert machine.is_pending_result(state, result)
    state = machine.advance(state, result, NOW)
    assert state.pending_step_id == "r:2:model" and state.messages[-1].role == "tool"
    state = machine.advance(state, _reply(state, 'Sure! {"action": "final_answer", "answer": "4"}'), NOW)
    assert state.status == "completed" and state.answer == "4" and state.step_index == 3
    assert state.prompt_tokens == 20 and state.completion_tokens == 10
    (topic, outcome), _ = machine.outputs(state, TOPICS)
    assert topic == TOPICS.outcomes and isinstance(outcome, RunCompleted) and outcome.steps == 3


def test_outputs_are_deterministic_for_a_state():
    state = machine.start(_task(), [CALC], NOW)
    first = [e for _, e in machine.outputs(state, TOPICS)]
    again = [e for _, e in machine.outputs(RunState.from_json(state.to_json()), TOPICS)]
    assert first == again  # same ids, same payloads: consumers drop the copies


def test_stale_and_duplicate_results_are_not_pending():
    state = machine.start(_task(), [CALC], NOW)
    reply = _reply(state, '{"action":"tool","tool":"calculator","arguments":{}}')
    state = machine.advance(state, reply, NOW)
    assert not machine.is_pending_result(state, reply)
    assert state.last_step_id == reply.step_id


def test_unparseable_replies_retry_then_fail():
    state = machine.start(_task(max_steps=10), [CALC], NOW)
    state = machine.advance(state, _reply(state, "no json here"), NOW)
    assert state.status == "running" and state.parse_failures == 1 and "not a valid action" in state.messages[-1].content
    state = machine.advance(state, _reply(state, '{"action": "dance"}'), NOW)
    state = machine.advance(state, _reply(state, '{"action": "final_answer"}'), NOW)
    assert state.status == "failed" and state.error_code == "unparseable_model_output"
    (_, outcome), _ = machine.outputs(state, TOPICS)
    assert isinstance(outcome, RunFailed) and outcome.error_code == "unparseable_model_output"


def test_disallowed_tool_is_told_to_the_model():
    state = machine.start(_task(), [CALC], NOW)
    state = machine.advance(state, _reply(state, '{"action":"tool","tool":"rm_rf","arguments":{}}'), NOW)
    assert state.pending_kind == "model" and "not available" in state.messages[-1].content


def test_retrieval_step_and_passages_in_the_conversation():
    state = machine.start(_task(), [CALC], NOW)
    state = machine.advance(state, _reply(state, '{"action":"retrieve","query":"kafka compaction"}'), NOW)
    assert state.pending_kind == "retrieval"
    assert state.pending_request == RetrievalRequest(query="kafka compaction", k=machine.RETRIEVAL_K)
    done = RetrievalCompleted.build(run_id="r", step=state.pending_step_id, service="retrieval")
    state = machine.advance(state, done, NOW)
    assert "no passages" in state.messages[-1].content and state.pending_kind == "model"


def test_max_steps_and_deadline():
    state = machine.start(_task(max_steps=2), [CALC], NOW)
    state = machine.advance(state, _reply(state, '{"action":"tool","tool":"calculator","arguments":{}}'), NOW)
    result = ToolCallCompleted.build(run_id="r", step=state.pending_step_id, service="tools", tool="calculator", ok=False, error="x")
    state = machine.advance(state, result, NOW)
    assert state.status == "failed" and state.error_code == "max_steps" and state.step_index == 2

    timed = machine.start(_task(deadline=NOW + timedelta(seconds=5)), [CALC], NOW)
    assert machine.expire(timed, NOW + timedelta(seconds=4)) is None
    expired = machine.expire(timed, NOW + timedelta(seconds=6))
    assert expired is not None and expired.error_code == "deadline_exceeded" and expired.version == timed.version + 1
    assert machine.expire(expired, NOW + timedelta(seconds=7)) is None


def test_state_json_round_trip():
    state = machine.start(_task(deadline=NOW + timedelta(minutes=1), metadata={"a": "b"}), [CALC], NOW)
    assert RunState.from_json(state.to_json()) == state


def _passages(state: RunState, text: str = "Kafka compacts topics.") -> RetrievalCompleted:
    return RetrievalCompleted.build(run_id="r", step="r:prefetch", service="retrieval",
                                    passages=[Passage(id="7", text=text, score=0.9, source="doc.md")])


def test_prefetch_ready_answers_a_matching_retrieval_at_once():
    state = machine.start(_task(task="how does kafka compaction work"), [CALC], NOW)
    later = NOW + timedelta(milliseconds=40)
    assert machine.is_prefetch_result(state, _passages(state))
    state = machine.prefetched(state, _passages(state), later)
    assert state.prefetch == "ready" and state.status == "running" and state.pending_kind == "model"
    asked = later + timedelta(milliseconds=100)
    state = machine.advance(state, _reply(state, '{"action":"retrieve","query":"kafka compaction"}'), asked)
    # The retrieval step (1) was answered from the prefetch in the same transition; the model is next.
    assert state.prefetch == "used" and state.pending_kind == "model" and state.pending_step_id == "r:2:model"
    assert state.prefetch_served == PrefetchServed(step_id="r:1:retrieval", step_index=1, query="kafka compaction",
                                                   saved_ms=40.0, waited=False)
    assert "Kafka compacts topics." in state.messages[-1].content
    assert not any(isinstance(e, RetrievalRequested) for _, e in machine.outputs(state, TOPICS))


def test_prefetch_in_flight_is_waited_for_and_other_queries_search_anew():
    state = machine.start(_task(task="how does kafka compaction work"), [CALC], NOW)
    asked = NOW + timedelta(milliseconds=30)
    waiting = machine.advance(state, _reply(state, '{"action":"retrieve","query":"kafka compaction"}'), asked)
    assert waiting.pending_kind == "retrieval" and waiting.waits_for_prefetch
    assert not any(isinstance(e, RetrievalRequested) for _, e in machine.outputs(waiting, TOPICS))
    done = machine.prefetched(waiting, _passages(waiting), NOW + timedelta(milliseconds=50))
    assert done.pending_kind == "model"
    assert done.prefetch_served == PrefetchServed(step_id="r:1:retrieval", step_index=1, query="kafka compaction",
                                                  saved_ms=30.0, waited=True)

    other = machine.advance(state, _reply(state, '{"action":"retrieve","query":"postgres vacuum tuning"}'), asked)
    (_, request), _ = machine.outputs(other, TOPICS)
    assert isinstance(request, RetrievalRequested) and request.query == "postgres vacuum tuning"


def test_approval_pauses_then_approve_or_deny():
    guarded = ToolInfo("wire_money", "Send money.", {"type": "object", "properties": {"amount": {"type": "number"}}},
                       requires_approval=True)
    state = machine.start(_task(tools=["wire_money"], prefetch=False), [guarded], NOW)
    state = machine.advance(state, _reply(state, '{"action":"tool","tool":"wire_money","arguments":{"amount":5}}'), NOW)
    assert state.status == "awaiting_approval" and state.pending_step_id == "r:1:tool"
    assert [type(e).__name__ for _, e in machine.outputs(state, TOPICS)] == ["RunStateSnapshot"]  # nothing runs

    def decision(ok: bool, step: str = "r:1:tool") -> ApprovalDecided:
        return ApprovalDecided.build(run_id="r", step=step, service="client", approved=ok, reason="no way",
                                     decided_by="ana")

    assert machine.decide(state, decision(True, "r:9:tool"), NOW) is None  # not the waiting step
    approved = machine.decide(state, decision(True), NOW)
    (_, call), _ = machine.outputs(approved, TOPICS)
    assert approved.status == "running" and isinstance(call, ToolCallRequested) and call.step_id == "r:1:tool"
    denied = machine.decide(state, decision(False), NOW)
    assert denied.pending_kind == "model" and "denied by a person: no way" in denied.messages[-1].content


def test_tool_failure_policy():
    def failed(state: RunState, exhausted: bool) -> ToolCallCompleted:
        return ToolCallCompleted.build(run_id="r", step=state.pending_step_id, service="tools", tool="calculator",
                                       ok=False, error="failed after 3 attempts" if exhausted else "bad arguments",
                                       error_kind="retries_exhausted" if exhausted else "invalid_arguments")

    for policy, exhausted, expect in [("fail_run", True, "failed"), ("fail_run", False, "running"),
                                      ("tell_model", True, "running")]:
        state = machine.start(_task(on_tool_error=policy, prefetch=False), [CALC], NOW)
        state = machine.advance(state, _reply(state, '{"action":"tool","tool":"calculator","arguments":{}}'), NOW)
        state = machine.advance(state, failed(state, exhausted), NOW)
        assert state.status == expect, (policy, exhausted)
        if expect == "failed":
            assert state.error_code == "tool_failed"
