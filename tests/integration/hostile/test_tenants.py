"""Two tenants on one secure broker and database (docs/security.md, "Tenants"), tried as tenant beta against
tenant acme: beta cannot write acme's intake or read acme's outcomes and tokens (prefix ACLs for its own
principal); beta's database login does not see acme's runs, steps or events (row-level security); beta's
approver cannot decide on acme's waiting call; a cancellation or a task naming acme's run, sent through
beta's own cell, leaves acme's run alone; acme's own approver decides and acme's run completes once. Beta's
quotas hold for beta only."""

from __future__ import annotations

import asyncpg
import pytest

from agentstream.ops.acls import tenant_prefix, tenant_principal
from agentstream.streams.core.errors import NotAnApprover
from agentstream.streams.core.events import RunCancelRequested
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import wait_awaiting_approval
from tests.integration.acl_probes import can_read, can_write, connection, send
from tests.integration.hostile.conftest import ACME, BETA

pytestmark = pytest.mark.asyncio(loop_scope="package")


async def test_a_tenant_reaches_its_own_topics_only(cells):
    stack = cells.stack
    a, b = Topics(tenant_prefix(BETA)), Topics(tenant_prefix(ACME))
    assert await can_write(stack, tenant_principal(BETA), a.tasks)
    assert await can_read(stack, tenant_principal(BETA), a.outcomes)
    assert not await can_write(stack, tenant_principal(BETA), b.tasks)
    assert not await can_read(stack, tenant_principal(BETA), b.outcomes)
    assert not await can_read(stack, tenant_principal(BETA), b.tokens)
    assert not await can_write(stack, tenant_principal(BETA), a.tool_requests)  # nor another party's topics in its own cell


async def test_one_tenant_cannot_read_approve_or_cancel_another_tenants_run(cells):
    async with cells.client(BETA) as a, cells.client(ACME) as b, \
            cells.client(BETA, "approver-beta") as approver_a, cells.client(ACME, "approver-acme") as approver_b:
        run_id = await b.submit('[[tool:transfer {"amount": 7}]] [[answer:sent]]', tools=["transfer"], prefetch=False)
        step = (await wait_awaiting_approval(b, run_id, 30))["step_id"]

        # Reads: acme sees its run; beta's login sees none of it.
        assert (await b.status(run_id) or {}).get("status") == "awaiting_approval"
        assert await a.status(run_id) is None
        assert await a.events(run_id) == []
        assert all(w["run_id"] != run_id for w in await a.awaiting_approval())
        async with connection(cells.stack.database_url_for(tenant_principal(BETA))) as conn:
            assert await conn.fetchval("SELECT count(*) FROM steps WHERE run_id = $1", run_id) == 0

        # Decisions: beta's approver may not decide on acme's run.
        with pytest.raises(NotAnApprover):
            await approver_a.approve(run_id, step)

        # A cancellation and a task naming acme's run, through beta's own cell: beta's planner does not
        # touch another cell's run.
        topics_a = cells.topics(BETA)
        cancel = RunCancelRequested.build(run_id=run_id, step=f"{run_id}:cancel", service="client",
                                          reason="from tenant beta", requested_by=BETA)
        await send(cells.stack, tenant_principal(BETA), topics_a.tasks, codec_for(a.settings).encode(cancel), run_id,
                   topics_a.partition_for(run_id))
        await a.submit("What is 1 + 1?", tools=["calculator"], run_id=run_id, max_steps=4, prefetch=False)

        await approver_b.approve(run_id, step, by="someone")
        result = await b.wait(run_id, timeout=60)
        assert result.ok and result.answer == "sent", result
        async with connection(cells.stack.database_url) as conn:
            effects = await conn.fetch("SELECT label FROM test_effects WHERE run_id = $1", run_id)
            decided_by = await conn.fetchval("SELECT decided_by FROM approval_decisions WHERE run_id = $1", run_id)
            prefix = await conn.fetchval("SELECT state->>'topic_prefix' FROM runs WHERE run_id = $1", run_id)
        assert [r["label"] for r in effects] == ["transfer 7"]
        assert (decided_by, prefix) == ("approver-acme", tenant_prefix(ACME))


async def test_a_tenant_quotas_hold_for_that_tenant_only(cells):
    async with cells.client(BETA) as a, cells.client(ACME) as b:
        too_long = await a.submit("What is 2 * 3?", tools=["calculator"], max_steps=8, prefetch=False)
        result = await a.wait(too_long, timeout=60)
        assert (result.status, result.error_code) == ("failed", "quota_exceeded") and "max_steps" in result.error

        wordy = await a.submit("Please think about this. " * 600 + "What is 2 * 3?", tools=["calculator"],
                               max_steps=4, prefetch=False)
        result = await a.wait(wordy, timeout=60)
        assert (result.status, result.error_code) == ("failed", "quota_exceeded") and "tokens" in result.error

        waiting = [await a.submit('[[tool:transfer {"amount": 1}]] [[answer:sent]]', tools=["transfer"], max_steps=4,
                                  prefetch=False) for _ in range(2)]
        for run_id in waiting:
            await wait_awaiting_approval(a, run_id, 30)
        third = await a.submit("What is 2 * 3?", tools=["calculator"], max_steps=4, prefetch=False)
        result = await a.wait(third, timeout=60)
        assert (result.status, result.error_code) == ("failed", "quota_exceeded") and "in flight" in result.error

        # Acme's cell has no such limits.
        free = await b.submit("What is 2 * 3?", tools=["calculator"], max_steps=8, prefetch=False)
        assert (await b.wait(free, timeout=60)).ok
        for run_id in waiting:  # beta's runs in flight, for the other tests of the package
            await a.cancel(run_id, "test over")
            assert (await a.wait(run_id, timeout=60)).error_code == "cancelled"


async def test_one_tenant_cannot_read_or_delete_another_tenants_session(cells):
    session = "shared-name"
    async with cells.client(ACME) as acme, cells.client(BETA) as beta, \
            cells.client(BETA, "approver-beta") as beta_approver, cells.client(ACME, "approver-acme") as acme_approver:
        run_id = await acme.submit("[[answer:kept]] remember me", tools=[], prefetch=False, session=session)
        assert (await acme.wait(run_id, timeout=60)).ok
        assert await beta.sessions.show(session) is None  # beta's login sees no other cell's session
        assert await beta_approver.sessions.delete(session) is None  # beta's own cell has none by that name
        async with connection(cells.stack.database_url_for("approver-beta")) as conn:
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="another cell"):
                await conn.fetchval("SELECT agentstream_delete_session($1, $2)", tenant_prefix(ACME), session)
        details = await acme.sessions.show(session)
        assert details is not None and [t["answer"] for t in details.row.turns] == ["kept"]  # untouched
        assert await acme_approver.sessions.delete(session) == []  # its own cell's approver may
        assert await acme.sessions.show(session) is not None and (await acme.sessions.show(session)).row.turns == []
