"""A run's state keeps its stored shape (``runs.state`` in PostgreSQL) now that the pending request and the
prefetch's served step are typed (services/planner/state.py): a state written before reads back into the
typed fields and writes the same JSON, byte for byte, and what the planner writes now is that shape —
which the tool service's claim (``pending_request ? 'approved_by'``) and ``AgentClient`` read."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from agentstream.services.planner import machine
from agentstream.services.planner.state import PrefetchServed, RetrievalRequest, RunState, ToolRequest
from agentstream.streams.core.events import (
    ApprovalDecided,
    InferenceCompleted,
    Passage,
    RetrievalCompleted,
    TaskSubmitted,
)

from .fakes import FakeKafka
from .planner_fakes import CALCULATOR, WIRE_MONEY, MemoryHistory, PlannerRig, settings

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

#: A state as the planner wrote it before the typed fields (every key, in its order).
OLD = {
    "run_id": "r", "status": "running", "task": "how does kafka compaction work", "tools": ["wire_money"],
    "max_steps": 5, "deadline": None, "expires_at": None, "model": None, "system_prompt": None,
    "step_index": 2, "pending_step_id": "r:1:tool", "pending_kind": "tool", "last_step_id": "r:0:model",
    "last_event_id": None, "pending_request": {}, "messages": [{"role": "user", "content": "hi", "name": None}],
    "response_schema": "{}", "answer": None, "error": None, "error_code": None, "parse_failures": 0,
    "prompt_tokens": 10, "completion_tokens": 5, "version": 3, "submitted_at": "2026-12-02T12:00:00+00:00",
    "updated_at": "2026-12-02T12:00:00+00:00", "traceparent": None, "approval_tools": ["wire_money"],
    "on_tool_error": "tell_model", "prefetch": "off", "prefetched": [], "prefetch_error": None,
    "prefetch_sent_at": None, "prefetch_ready_at": None, "prefetch_served": None, "replay_of": None,
    "topic_prefix": "",
}
APPROVED = {"tool": "wire_money", "arguments": {"amount": 5}, "approved_by": "ana"}
WAITING = {"query": "kafka compaction", "k": 4, "prefetch": True, "asked_at": "2026-12-02T12:00:00.030000+00:00"}
SERVED = {"step_id": "r:1:retrieval", "step_index": 1, "query": "kafka compaction", "saved_ms": 30.0,
          "waited": True}


@pytest.mark.parametrize(("changes", "pending", "served"), [
    ({}, None, None),
    ({"pending_request": {"tool": "wire_money", "arguments": {"amount": 5}}},
     ToolRequest(tool="wire_money", arguments={"amount": 5}), None),
    ({"pending_request": APPROVED}, ToolRequest(tool="wire_money", arguments={"amount": 5}, approved_by="ana"), None),
    ({"pending_request": {"query": "kafka", "k": 4}}, RetrievalRequest(query="kafka", k=4), None),
    ({"pending_request": WAITING},
     RetrievalRequest(query="kafka compaction", k=4, prefetch=True, asked_at=NOW + timedelta(milliseconds=30)), None),
    ({"pending_request": {"query": "kafka compaction", "k": 4, "prefetch": True}},
     RetrievalRequest(query="kafka compaction", k=4, prefetch=True), None),
    ({"prefetch_served": SERVED}, None, PrefetchServed(**SERVED)),
])
def test_an_old_state_reads_into_the_typed_fields_and_writes_back_byte_for_byte(changes, pending, served):
    raw = json.dumps({**OLD, **changes})
    state = RunState.from_json(raw)
    assert state.pending_request == pending and state.prefetch_served == served
    assert state.to_json() == raw
    assert RunState.from_json(json.loads(raw)) == state  # (as asyncpg hands over a jsonb value)


def _reply(state: RunState, text: str, at: datetime = NOW) -> InferenceCompleted:
    return InferenceCompleted.build(run_id="r", step=state.pending_step_id, service="inference", text=text,
                                    finish_reason="stop", prompt_tokens=10, completion_tokens=5, created_at=at)


def _task(**kw) -> TaskSubmitted:
    payload = {"task": "how does kafka compaction work", "tools": ["calculator"], "max_steps": 5, **kw}
    return TaskSubmitted.build(run_id="r", step="r:task", service="client", created_at=NOW, **payload)


def test_the_machine_writes_requests_and_the_served_step_in_the_old_shape():
    guarded = machine.start(_task(tools=["wire_money"], prefetch=False), [WIRE_MONEY], NOW)
    guarded = machine.advance(guarded, _reply(guarded, '{"action":"tool","tool":"wire_money","arguments":{"amount":5}}'),
                              NOW)
    assert guarded.to_dict()["pending_request"] == {"tool": "wire_money", "arguments": {"amount": 5}}
    approved = machine.decide(guarded, ApprovalDecided.build(run_id="r", step="r:1:tool", service="client",
                                                             approved=True, reason="ok", decided_by="ana"), NOW)
    assert approved is not None and approved.to_dict()["pending_request"] == APPROVED

    state = machine.start(_task(), [CALCULATOR], NOW)
    assert state.to_dict()["pending_request"] == {}  # a model step
    waiting = machine.advance(state, _reply(state, '{"action":"retrieve","query":"kafka compaction"}'),
                              NOW + timedelta(milliseconds=30))
    assert waiting.to_dict()["pending_request"] == WAITING
    passages = RetrievalCompleted.build(run_id="r", step="r:prefetch", service="retrieval",
                                        passages=[Passage(id="7", text="Kafka compacts.", score=0.9, source="d.md")])
    served = machine.prefetched(waiting, passages, NOW + timedelta(milliseconds=50)).to_dict()
    assert served["prefetch_served"] == SERVED and served["pending_request"] == {}


async def test_the_history_rows_keep_their_shape():
    r = PlannerRig(FakeKafka(), MemoryHistory(), settings())
    await r.take(0)
    await r.feed(_task(tools=["wire_money"], prefetch=False))
    await r.feed(_reply(r.store.state("r"), '{"action":"tool","tool":"wire_money","arguments":{"amount":5}}'))
    (waiting,) = [row for row in r.store.transitions[-1].steps_requested if row.kind == "tool"]
    assert waiting.request == {"tool": "wire_money", "arguments": {"amount": 5}, "awaiting_approval": True}
    await r.feed(ApprovalDecided.build(run_id="r", step="r:1:tool", service="client", approved=True, reason="",
                                       decided_by="ana"))
    assert json.loads(r.store.runs["r"].state)["pending_request"] == APPROVED  # the claim looks for approved_by

    r = PlannerRig(FakeKafka(), MemoryHistory(), settings())
    await r.take(0)
    await r.feed(_task())
    await r.feed(RetrievalCompleted.build(run_id="r", step="r:prefetch", service="retrieval",
                                          passages=[Passage(id="7", text="Kafka compacts.", score=0.9, source="d")]))
    await r.feed(_reply(r.store.state("r"), '{"action":"retrieve","query":"kafka compaction"}'))
    last = r.store.transitions[-1]
    (step,) = [row for row in last.steps_requested if row.kind == "retrieval"]
    assert step.request == {"query": "kafka compaction", "from_prefetch": True}
    (result,) = [c for c in last.steps_completed if c.step_id == step.step_id]
    assert result.result["from_prefetch"] is True and result.result["waited"] is False
    assert json.loads(r.store.runs["r"].state)["prefetch_served"]["step_id"] == "r:1:retrieval"
