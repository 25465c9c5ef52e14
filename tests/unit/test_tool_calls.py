"""The parts of the tool-call check that need no database (streams/store/tool_calls.py); the check itself, a
statement against the runs table, is tested on PostgreSQL: tests/integration/test_forged_tool_calls.py."""

from __future__ import annotations

from typing import get_args

from agentstream.streams.core.events import ToolCallRequested
from agentstream.streams.store.tool_calls import ANSWERED, Refusal, Verdict, refusal_reason, same_call

CALL = ToolCallRequested.build(run_id="run-a", step="run-a:1:tool", service="planner", tool="transfer",
                               arguments='{"amount": 5}')


def test_every_refusal_has_a_reason_that_starts_with_its_code_and_names_the_call():
    for refusal in get_args(Refusal):
        reason = refusal_reason(refusal, CALL, run_status="failed", run_error_code="cancelled",
                                pending_step="run-a:3:model")
        assert reason.startswith(f"{refusal}: "), reason
        assert any(name in reason for name in ("run-a", "transfer")), reason
    assert refusal_reason("run_finished", CALL, run_status="failed", run_error_code="cancelled").endswith(
        "has ended (failed: cancelled)")
    assert "its pending step: none" in refusal_reason("not_pending", CALL)


def test_only_a_call_the_run_asked_for_is_answered_the_rest_is_dead_lettered():
    assert ANSWERED == {"approval_required"}
    assert Verdict("approval_required").answers_the_run
    assert not any(Verdict(r).answers_the_run for r in get_args(Refusal) if r != "approval_required")
    assert not Verdict().answers_the_run  # not refused at all


def test_an_earlier_claim_answers_only_the_same_call():
    assert same_call(CALL, run_id="run-a", tool="transfer", same_arguments=True)
    assert not same_call(CALL, run_id="run-b", tool="transfer", same_arguments=True)
    assert not same_call(CALL, run_id="run-a", tool="effect", same_arguments=True)
    assert not same_call(CALL, run_id="run-a", tool="transfer", same_arguments=False)
