"""Sessions over their token budget with ``overflow = summarise`` (services/planner/summaries.py): the
oldest turns are set apart, a model step of the turn condenses them, and the turn begins from the summary
and the newest turns, within the budget; the summary is recorded with the run and carried by the session."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from agentstream.services.planner import machine, summaries, transcript
from agentstream.services.planner.state import RunState, SummaryRequest
from agentstream.services.planner.transcript import Transcript, Turn
from agentstream.streams.core.events import (
    InferenceCompleted,
    InferenceRequested,
    SessionUpdated,
    TaskSubmitted,
)
from agentstream.streams.kafka.topics import Topics

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
TOPICS = Topics()


def turn(i: int, size: int = 60) -> Turn:
    return Turn.of(f"r{i}", f"question {i} " + "x" * size, json.dumps({"action": "final_answer", "answer": f"a{i}"}),
                   f"a{i}")


def queued(max_steps: int = 4) -> RunState:
    task = TaskSubmitted.build(run_id="t9", step="t9:task", service="client", created_at=NOW, task="and now?",
                               tools=[], max_steps=max_steps, session="s")
    return machine.start(task, [], NOW, queued=True)


def reply(text: str, error: str | None = None, step: str = "t9:0:model") -> InferenceCompleted:
    return InferenceCompleted.build(run_id="t9", step=step, service="inference", text=text,
                                    finish_reason="error" if error else "stop", error=error, prompt_tokens=50,
                                    completion_tokens=20)


def test_condense_sets_the_oldest_turns_apart_leaving_room_for_the_summary():
    history = Transcript(turns=tuple(turn(i) for i in range(6)), dropped=2, summary="old")
    each = history.turns[0].tokens
    assert summaries.condense(history, 100 * each) == (history, ())  # within the budget: nothing to fold
    budget = 3 * each
    kept, fold = summaries.condense(history, budget)
    assert [t.run_id for t in fold] == ["r0", "r1", "r2", "r3"] and [t.run_id for t in kept.turns] == ["r4", "r5"]
    assert kept.dropped == 6 and kept.summary == "old"
    assert sum(t.tokens for t in kept.turns) <= budget - summaries.summary_tokens(budget)


def test_a_turn_over_its_budget_first_asks_the_model_for_a_summary():
    history = Transcript(turns=tuple(turn(i) for i in range(6)), summary="The user is Ada.")
    budget = 3 * history.turns[0].tokens
    kept, fold = summaries.condense(history, budget)
    state = machine.begin(queued(max_steps=1), kept, NOW, fold=fold, budget=budget)
    assert isinstance(state.pending_request, SummaryRequest) and state.pending_step_id == "t9:0:model"
    assert state.max_steps == 2  # the summary step comes on top of the task's own
    (_, prefetch), (_, request), _ = machine.outputs(state, TOPICS)
    assert prefetch.step_id == "t9:prefetch"  # the prefetch runs while the summary is written
    assert isinstance(request, InferenceRequested) and request.response_schema is None and request.tools is None
    assert request.max_tokens == summaries.summary_tokens(budget) and request.temperature == 0.0
    prompt = request.messages[1].content
    assert prompt.startswith("Earlier summary: The user is Ada.") and "question 0" in prompt and "a3" in prompt
    assert "question 4" not in prompt  # kept verbatim, not summarised
    # the pending summary survives a restart (stored state)
    assert RunState.from_json(state.to_json()).pending_request == state.pending_request


def test_the_turn_begins_from_the_summary_and_the_newest_turns_and_the_session_keeps_the_summary():
    history = Transcript(turns=tuple(turn(i) for i in range(6)))
    budget = 3 * history.turns[0].tokens
    kept, fold = summaries.condense(history, budget)
    state = machine.begin(queued(), kept, NOW, fold=fold, budget=budget)
    state = machine.advance(state, reply("The user asked questions 0 to 3; the answers were a0 to a3."), NOW)
    assert state.pending_step_id == "t9:1:model" and state.prompt_tokens == 50 and state.completion_tokens == 20
    (_, request), _ = machine.outputs(state, TOPICS)
    system, *rest = request.messages
    assert system.content.endswith("Summary of the conversation before the turns below: The user asked questions "
                                   "0 to 3; the answers were a0 to a3.")
    assert [m.content for m in rest] == [turn(4).user, turn(4).reply, turn(5).user, turn(5).reply, "and now?"]
    started = transcript.started(RunState.from_json(state.to_json()))
    assert started.summary.startswith("The user asked") and started.tokens <= budget and started.dropped == 4
    done = machine.advance(state, reply('{"action": "final_answer", "answer": "ok"}', step="t9:1:model"), NOW)
    updated = next(e for _, e in machine.outputs(done, TOPICS) if isinstance(e, SessionUpdated))
    assert updated.summary.startswith("The user asked") and [t.run_id for t in updated.turns] == ["r4", "r5", "t9"]
    after = transcript.finished(done)
    assert after is not None and after.rows()[0] == {"summary": updated.summary, "tokens": after.summary_tokens}
    assert Transcript.from_rows(0, after.rows(), after.dropped) == after  # read back as stored


def test_a_failed_summary_step_drops_the_folded_turns_and_the_turn_goes_on():
    history = Transcript(turns=tuple(turn(i) for i in range(6)), summary="earlier")
    budget = 3 * history.turns[0].tokens
    kept, fold = summaries.condense(history, budget)
    state = machine.begin(queued(), kept, NOW, fold=fold, budget=budget)
    state = machine.advance(state, reply("", error="engine down"), NOW)
    assert state.status == "running" and state.pending_step_id == "t9:1:model"
    assert transcript.started(state).summary == "earlier" and transcript.started(state).dropped == 4


def test_a_summary_longer_than_its_share_is_cut_and_the_transcript_stays_within_the_budget():
    kept = Transcript(turns=(turn(1), turn(2)))
    budget = kept.tokens + 40
    after = summaries.summarised(kept, "word " * 5000, budget)
    assert after.tokens <= budget and len(after.summary) <= summaries.summary_tokens(budget) * 3
