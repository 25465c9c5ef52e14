"""The tool service (services/tools/service.py) on an in-memory broker and database (agentstream.testing).

What is proved here, with no Kafka and no PostgreSQL: a claimed call runs once and a redelivery is
answered from its row; a call whose row says ``running`` (its worker died mid-execution) is not run
again; a call its run did not ask for is refused — not run, dead-lettered, its id not remembered — and
one its run asked for but this worker's definition requires approval for is answered with the refusal;
an idempotent tool keeps no row and a copy that arrives after its run moved on is dropped; retries
follow the tool's ``max_attempts`` and end in a dead letter; and a database outage is an outage, not a
failure: the handler raises it for the runtime to wait out, and the next try runs the tool again
instead of answering "interrupted".
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from agentstream.services.tools.registry import ToolContext, tool
from agentstream.streams.core.errors import ToolError
from agentstream.streams.core.events import DeadLetter, ToolCallCompleted
from agentstream.streams.core.outages import DATABASE, outage_of
from agentstream.testing import InMemoryDatabase, ToolHarness
from agentstream.testing.database import ToolCallRow

runs: list[str] = []


@tool
async def charge(amount: int, ctx: ToolContext) -> dict:
    """Has an effect: runs at most once per step."""
    runs.append(f"charge {amount} attempt {ctx.attempt}")
    return {"charged": amount}


@tool(idempotent=True)
async def lookup(key: str) -> str:
    runs.append(f"lookup {key}")
    return key.upper()


@tool(requires_approval=True)
async def delete_all() -> str:
    runs.append("delete_all")
    return "deleted"


@tool(max_attempts=3, backoff_s=0.001)
async def flaky(fail: int, ctx: ToolContext) -> int:
    runs.append(f"flaky attempt {ctx.attempt}")
    if ctx.attempt <= fail:
        raise ToolError("upstream busy", retriable=True)
    return ctx.attempt


@tool
async def write(row: str, ctx: ToolContext) -> str:
    """Writes through the worker's pool: fails as the database does."""
    runs.append(f"write {row} attempt {ctx.attempt}")
    assert ctx.pool is not None
    await ctx.pool.execute("INSERT INTO ledger VALUES ($1)", row)
    return "written"


@tool
async def remote() -> str:
    raise ConnectionRefusedError(111, "the remote service refused")  # not this worker's database


TOOLS = [charge, lookup, delete_all, flaky, write, remote]


@pytest.fixture(autouse=True)
def clear_runs() -> None:
    runs.clear()


#: Set to make the database go down at the tool's next write (mid-execution).
dies_on_write: list[bool] = []


@pytest.fixture
async def harness():
    database = InMemoryDatabase()

    def insert(row: str) -> str:
        if dies_on_write:
            dies_on_write.clear()
            database.down = True
            raise ConnectionRefusedError(111, "connection refused")
        return "INSERT 0 1"

    database.on("INSERT INTO ledger", insert)
    async with ToolHarness(TOOLS, database=database) as harness:
        yield harness


async def test_a_claimed_call_runs_once_and_a_redelivery_is_answered_from_its_row(harness):
    request = harness.request("charge", {"amount": 5})
    harness.expect(request)
    first = (await harness.deliver(request)).one(ToolCallCompleted)
    assert first.ok and json.loads(first.result) == {"charged": 5} and not first.replayed
    row = harness.database.tool_calls[request.step_id]
    assert (row.status, row.result, row.attempts) == ("succeeded", {"charged": 5}, 1)
    again = (await harness.deliver(request)).one(ToolCallCompleted)  # a redelivery of the same request
    assert again.replayed and again.ok and json.loads(again.result) == {"charged": 5}
    assert runs == ["charge 5 attempt 1"]


async def test_a_call_interrupted_mid_execution_is_not_run_again(harness):
    request = harness.request("charge", {"amount": 5})
    harness.expect(request)
    # claimed by a worker that died before the row got the result
    harness.database.tool_calls[request.step_id] = ToolCallRow(request.step_id, request.run_id, "charge", {"amount": 5})
    result = (await harness.deliver(request)).one(ToolCallCompleted)
    assert not result.ok and result.error_kind == "interrupted" and result.replayed
    assert runs == []


@pytest.mark.parametrize("setup, refusal", [
    (lambda db, r: None, "unknown_run"),
    (lambda db, r: db.expect(r, tools=["lookup"]), "tool_not_allowed"),
    # (an ended run's call it never asked for: the step id is not the one it requested)
    (lambda db, r: setattr(db.expect(replace(r, step_id=r.run_id + ":1:tool")), "status", "completed"),
     "run_finished"),
    (lambda db, r: db.expect(replace(r, step_id=r.run_id + ":1:tool")), "not_pending"),
    (lambda db, r: db.expect(replace(r, arguments='{"amount": 500}')), "not_as_requested"),
])
async def test_a_call_its_run_did_not_ask_for_is_refused_not_run(harness, setup, refusal):
    request = harness.request("charge", {"amount": 5})
    setup(harness.database, request)
    handled = await harness.deliver(request)
    assert runs == [] and handled.of(ToolCallCompleted) == []  # nothing the planner could apply
    letter = handled.one(DeadLetter)
    assert letter.error_kind == "refused" and letter.reason.startswith(refusal), letter.reason
    assert (letter.run_id, letter.source_topic) == (request.run_id, harness.broker.topics.tool_requests)
    assert not handled.remembered  # a forgery must not make the real request (same id) a duplicate
    assert request.step_id not in harness.database.tool_calls


async def test_approval_a_run_did_not_ask_for_is_the_steps_error_result(harness):
    request = harness.request("delete_all")
    harness.database.expect(request)  # a plan from before the tool needed approval: not in approval_tools
    result = (await harness.deliver(request)).one(ToolCallCompleted)
    assert not result.ok and result.error_kind == "refused" and "approval" in (result.error or "")
    assert runs == []
    approved = await harness.call("delete_all", approved=True)
    assert approved.ok and runs == ["delete_all"]


async def test_an_idempotent_tool_keeps_no_row_and_a_late_copy_is_dropped(harness):
    request = harness.request("lookup", {"key": "k"})
    harness.expect(request)
    assert (await harness.deliver(request)).one(ToolCallCompleted).result == '"K"'
    assert (await harness.deliver(request)).one(ToolCallCompleted).ok  # redelivered: runs again
    assert runs == ["lookup k", "lookup k"] and harness.database.tool_calls == {}
    harness.database.step_done(request)  # the run applied the answer and moved on
    late = await harness.deliver(request)
    assert late.sent == [] and runs == ["lookup k", "lookup k"]  # dropped: neither answered nor refused


async def test_unknown_tools_and_bad_arguments_are_answered_without_running(harness):
    unknown = await harness.call("nope")
    assert unknown.error_kind == "unknown_tool" and "charge" in (unknown.error or "")
    bad = await harness.call("charge", {"amount": "five"})
    assert bad.error_kind == "invalid_arguments" and runs == []
    assert harness.database.tool_calls == {}  # checked against the run, never claimed


async def test_retriable_errors_are_retried_up_to_max_attempts_then_dead_lettered(harness):
    recovered = await harness.call("flaky", {"fail": 2})
    assert recovered.ok and recovered.result == "3" and recovered.attempts == 3
    runs.clear()
    request = harness.request("flaky", {"fail": 5})
    harness.expect(request)
    handled = await harness.deliver(request)
    result = handled.one(ToolCallCompleted)
    assert not result.ok and result.error_kind == "retries_exhausted" and result.attempts == 3
    assert result.error == "failed after 3 attempts: upstream busy"
    assert runs == ["flaky attempt 1", "flaky attempt 2", "flaky attempt 3"]
    assert handled.one(DeadLetter).error_kind == "retries_exhausted"
    assert harness.database.tool_calls[request.step_id].status == "failed"


async def test_a_database_outage_is_an_outage_not_a_failure(harness):
    request = harness.request("write", {"row": "r1"})
    harness.expect(request)
    dies_on_write.append(True)
    with pytest.raises(ConnectionRefusedError) as raised:  # for the runtime to wait out, partition paused
        await harness.deliver(request)
    assert outage_of(raised.value) == DATABASE
    assert harness.database.tool_calls[request.step_id].status == "running"  # claimed, not finished
    assert harness.broker.events(harness.broker.topics.tool_results) == []  # no failure reported to the run
    assert harness.broker.events(harness.broker.topics.dlq) == []
    harness.database.down = False
    result = (await harness.deliver(request)).one(ToolCallCompleted)  # the runtime's next try
    assert result.ok and result.attempts == 2 and not result.replayed  # run again, not "interrupted"
    assert runs == ["write r1 attempt 1", "write r1 attempt 2"]
    assert harness.database.tool_calls[request.step_id].status == "succeeded"


async def test_an_outage_of_something_else_while_the_database_answers_is_the_tools_error(harness):
    result = await harness.call("remote")
    assert not result.ok and result.error_kind == "tool_error" and "refused" in (result.error or "")


async def test_a_call_whose_run_ended_before_it_ran_is_dropped_not_run_nor_dead_lettered(harness):
    """A deadline or a cancel ended the run while its call was on the way: the call is stale, not forged."""
    request = harness.request("charge", {"amount": 5})
    harness.database.expect(request).status = "failed"
    handled = await harness.deliver(request)
    assert runs == [] and handled.of(ToolCallCompleted) == [] and handled.of(DeadLetter) == []
