"""Decisions on tool calls and who reads runs (issue 37, finding 8 and "the default cell's client login
reads every tenant's runs"), on the secure stack with two tenants:

- a deny after an approval: the client and the real CLI (`agentstream deny`, as acme's operator runs it)
  say that the earlier approval stands, and the CLI exits 3; the tool runs once;
- a decision on a step the run has not reached (or on a run that never waits) is refused by
  ``agentstream_decide()`` and nothing is recorded; the step the run does wait at is still open;
- the default cell's ``client`` login reads none of a tenant's runs, steps, events or decisions (nor
  does `agentstream status` without a tenant), while the operator's reader (``operator-reader``,
  `agentstream status --operator`) reads them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from agentstream.ops.acls import tenant_principal
from agentstream.streams.core.errors import NotAwaitingApproval
from agentstream.streams.core.ids import step_id
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import wait_awaiting_approval
from tests.integration.acl_probes import connection
from tests.integration.hostile.conftest import ACME, BETA, PARTITIONS, Cells
from tests.integration.processes import ROOT

pytestmark = pytest.mark.asyncio(loop_scope="package")
TRANSFER = '[[tool:transfer {{"amount": {amount}}}]] [[answer:sent]]'


async def _cli(cells: Cells, tenant: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    """``agentstream ARGS`` as an operator on this machine runs it: the stack's state directory, and the
    tenant (None: the default cell). No DATABASE_URL or KAFKA_BOOTSTRAP_SERVERS: the CLI finds the stack,
    its principal and its database login (``approver-<tenant>`` for a decision) as on ``dev up --secure``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTSTREAM_", "KAFKA_", "DATABASE_"))}
    env.update({k: v for k, v in cells.stack.env().items() if k not in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")},
               AGENTSTREAM_PARTITIONS=str(PARTITIONS), **({"AGENTSTREAM_TENANT": tenant} if tenant else {}))
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentstream.cli", *args], cwd=ROOT,
                                   env=env, capture_output=True, text=True, timeout=120)


async def _decisions(cells: Cells, *run_ids: str) -> list[tuple[str, str, bool, str]]:
    async with connection(cells.stack.database_url) as conn:
        rows = await conn.fetch("SELECT run_id, step_id, approved, decided_by FROM approval_decisions "
                                "WHERE run_id = ANY($1::text[]) ORDER BY run_id, step_id", list(run_ids))
    return [(r["run_id"], r["step_id"], r["approved"], r["decided_by"]) for r in rows]


async def test_a_deny_after_an_approval_says_the_approval_stands(cells):
    async with cells.client(ACME) as client, cells.client(ACME, "approver-acme") as approver:
        run_id = await client.submit(TRANSFER.format(amount=3), tools=["transfer"], prefetch=False)
        step = (await wait_awaiting_approval(client, run_id, 30))["step_id"]

        approved = await approver.approve(run_id, step, reason="fine")
        assert (approved.approved, approved.earlier, approved.as_asked, approved.decided_by) == (
            True, False, True, "approver-acme")
        denied = await approver.deny(run_id, step, reason="changed my mind")
        assert (denied.approved, denied.earlier, denied.as_asked, denied.reason, denied.decided_at) == (
            True, True, False, "fine", approved.decided_at)

        # The CLI, as acme's operator runs it: what is recorded, and that it is not what was asked.
        cli = await _cli(cells, ACME, "deny", run_id, step, "--reason", "really")
        assert cli.returncode == 3, cli.stdout + cli.stderr
        assert cli.stdout.startswith(f"not denied: {run_id} {step} was approved by approver-acme at "), cli.stdout
        assert "earlier decision stands" in cli.stdout and "the tool call goes ahead" in cli.stdout
        as_json = await _cli(cells, ACME, "approve", run_id, step, "--json")  # a retry of the approval: fine
        assert as_json.returncode == 0, as_json.stdout + as_json.stderr
        assert {k: v for k, v in json.loads(as_json.stdout).items() if k != "decided_at"} == {
            "run_id": run_id, "step_id": step, "asked": True, "approved": True, "reason": "fine",
            "decided_by": "approver-acme", "recorded": True, "earlier": True, "as_asked": True}

        result = await client.wait(run_id, timeout=60)
        assert result.ok and result.answer == "sent", result
        assert await cells.effects(run_id) == ["transfer 3"]
        assert await _decisions(cells, run_id) == [(run_id, step, True, "approver-acme")]


async def test_a_decision_on_a_step_the_run_has_not_reached_is_refused_and_not_recorded(cells):
    async with cells.client(ACME) as client, cells.client(ACME, "approver-acme") as approver:
        done = await client.submit("What is 2 * 3?", tools=["calculator"], prefetch=False)
        assert (await client.wait(done, timeout=60)).ok
        run_id = await client.submit(TRANSFER.format(amount=4), tools=["transfer"], prefetch=False)
        step = (await wait_awaiting_approval(client, run_id, 30))["step_id"]
        index = int(step.split(":")[-2])

        later = step_id(run_id, index + 2, "tool")  # decided ahead, for whatever call comes up there
        with pytest.raises(NotAwaitingApproval, match=f"waits for approval at step {step}, not at {later}"):
            await approver.approve(run_id, later)
        with pytest.raises(NotAwaitingApproval, match=f"run {done} is completed"):
            await approver.approve(done, step_id(done, 1, "tool"))
        cli = await _cli(cells, ACME, "approve", run_id, later)
        assert cli.returncode == 1 and "nothing was recorded" in cli.stderr, cli.stdout + cli.stderr
        assert await _decisions(cells, run_id, done) == []

        # The step the run waits at is still open to its approver; denied, the tool never runs.
        denied = await approver.deny(run_id, step, reason="not today")
        assert (denied.approved, denied.earlier) == (False, False)
        result = await client.wait(run_id, timeout=60)
        assert result.ok, result
        assert await cells.effects(run_id) == []
        assert await _decisions(cells, run_id, done) == [(run_id, step, False, "approver-acme")]


async def test_the_default_cells_client_login_reads_no_tenants_run_and_the_operators_reader_does(cells):
    async with cells.client(BETA) as beta:
        run_id = await beta.submit("What is 2 * 3?", tools=["calculator"], max_steps=4, prefetch=False)
        assert (await beta.wait(run_id, timeout=60)).ok

    seen: dict[str, tuple[int, ...]] = {}
    for login in ("client", tenant_principal(ACME), "operator-reader", "approver"):
        async with connection(cells.stack.database_url_for(login)) as conn:
            counts = [await conn.fetchval(f"SELECT count(*) FROM {table} WHERE run_id = $1", run_id)
                      for table in ("runs", "steps", "events")]
            if login in ("client", "operator-reader"):  # (a tenant's login has no grant on it at all)
                counts.append(await conn.fetchval("SELECT count(*) FROM approval_decisions"))
        seen[login] = tuple(counts)
    async with connection(cells.stack.database_url) as conn:
        decisions = await conn.fetchval("SELECT count(*) FROM approval_decisions")
    assert seen["client"] == (0, 0, 0, 0)
    assert seen[tenant_principal(ACME)] == (0, 0, 0)
    runs, steps, events, all_decisions = seen["operator-reader"]
    assert (runs, steps > 0, events > 0, all_decisions) == (1, True, True, decisions)
    assert seen["approver"] == (runs, steps, events)  # the operator's approver decides on, and reads, any cell's

    # The CLI without a tenant is the default cell's client: it finds no such run; --operator reads it.
    await cells.stack.grant(Topics("", partitions=PARTITIONS))  # the default cell, as `dev up` makes it
    as_client = await _cli(cells, None, "status", run_id, "--json")
    assert as_client.returncode == 2 and f"no run {run_id}" in as_client.stderr, as_client.stdout + as_client.stderr
    as_operator = await _cli(cells, None, "status", run_id, "--json", "--operator")
    assert as_operator.returncode == 0, as_operator.stdout + as_operator.stderr
    assert json.loads(as_operator.stdout)["status"] == "completed"
