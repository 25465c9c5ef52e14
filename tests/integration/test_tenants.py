"""Two tenants on one secure broker and database (docs/security.md, "Tenants"), tried as tenant A against
tenant B: A cannot write B's intake or read B's outcomes and tokens (prefix ACLs for its own principal);
A's database login does not see B's runs, steps or events (row-level security); A's approver cannot decide
on B's waiting call; a cancellation or a task naming B's run, sent through A's own cell, leaves B's run
alone; B's own approver decides and B's run completes once."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from agentstream.devstack.private import PrivateStack
from agentstream.streams.acls import tenant_prefix, tenant_principal
from agentstream.streams.client import AgentClient, NotAnApprover
from agentstream.streams.codec import codec_for
from agentstream.streams.events import RunCancelRequested
from agentstream.streams.tool_catalog import ToolCatalog
from agentstream.streams.topics import Topics
from agentstream.testing import wait_awaiting_approval
from tests.integration.acl_probes import can_read, can_write, connection, send
from tests.integration.pipeline_tools import EFFECTS_TABLE
from tests.integration.processes import start_worker, stop, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")
TENANTS = ("a", "b")
TOOLS = ["--tools", "agentstream.services.tools.builtin", "--tools", "tests.integration.pipeline_tools"]
#: Tenant A's limits (its cell's planner enforces them); tenant B has none.
QUOTAS_A = {"AGENTSTREAM_QUOTA_MAX_STEPS": "6", "AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT": "2",
            "AGENTSTREAM_QUOTA_TOKENS_PER_RUN": "2000"}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory) -> AsyncIterator[PrivateStack]:
    """The stack, each tenant's cell (its topics and ACLs), and a worker process per cell running the four
    services as the `worker` principal with its own database login."""
    directory = tmp_path_factory.mktemp("tenants")
    private = PrivateStack(directory / "state", secure=True, tenants=TENANTS)
    await private.start()
    procs = []
    try:
        async with connection(private.database_url) as conn:
            await conn.execute(EFFECTS_TABLE)
            await conn.execute("GRANT SELECT, INSERT ON test_effects TO agentstream_tools; "
                               "GRANT USAGE ON SEQUENCE test_effects_id_seq TO agentstream_tools")
        for tenant in TENANTS:
            await private.grant(Topics(tenant_prefix(tenant), partitions=4), client=tenant_principal(tenant))
            settings = private.settings(topic_prefix=tenant_prefix(tenant))
            procs.append(start_worker(settings, "all", directory / f"worker-{tenant}.log", *TOOLS,
                                      **private.env("worker"), **(QUOTAS_A if tenant == "a" else {})))
        for tenant in TENANTS:
            async with _client(private, tenant) as client:
                catalog = ToolCatalog.for_runtime(client.runtime, ttl_s=0.0)
                try:
                    await wait_for(lambda c=catalog: _has(c, "transfer"), 90, f"tenant {tenant}'s tools")
                finally:
                    await catalog.close()
        yield private
    finally:
        for proc in procs:
            stop(proc)
        await private.close()


def _client(stack: PrivateStack, tenant: str, login: str | None = None) -> AgentClient:
    return AgentClient(stack.settings(topic_prefix=tenant_prefix(tenant), principal=tenant_principal(tenant),
                                      database_login=login or tenant_principal(tenant)))


async def _has(catalog: ToolCatalog, tool: str) -> bool:
    return tool in await catalog.refresh()








async def test_a_tenant_reaches_its_own_topics_only(stack):
    a, b = Topics(tenant_prefix("a")), Topics(tenant_prefix("b"))
    assert await can_write(stack, tenant_principal("a"), a.tasks)
    assert await can_read(stack, tenant_principal("a"), a.outcomes)
    assert not await can_write(stack, tenant_principal("a"), b.tasks)
    assert not await can_read(stack, tenant_principal("a"), b.outcomes)
    assert not await can_read(stack, tenant_principal("a"), b.tokens)
    assert not await can_write(stack, tenant_principal("a"), a.tool_requests)  # nor another party's topics in its own cell


async def test_tenant_a_cannot_read_approve_or_cancel_tenant_b_run(stack):
    async with _client(stack, "a") as a, _client(stack, "b") as b, \
            _client(stack, "a", "approver-a") as approver_a, _client(stack, "b", "approver-b") as approver_b:
        run_id = await b.submit('[[tool:transfer {"amount": 7}]] [[answer:sent]]', tools=["transfer"], prefetch=False)
        step = (await wait_awaiting_approval(b, run_id, 30))["step_id"]

        # Reads: B sees its run; A's login sees none of it.
        assert (await b.status(run_id) or {}).get("status") == "awaiting_approval"
        assert await a.status(run_id) is None
        assert await a.events(run_id) == []
        assert all(w["run_id"] != run_id for w in await a.awaiting_approval())
        async with connection(stack.database_url_for(tenant_principal("a"))) as conn:
            assert await conn.fetchval("SELECT count(*) FROM steps WHERE run_id = $1", run_id) == 0

        # Decisions: A's approver may not decide on B's run.
        with pytest.raises(NotAnApprover):
            await approver_a.approve(run_id, step)

        # A cancellation and a task naming B's run, through A's own cell: A's planner does not touch
        # another cell's run.
        topics_a = Topics(tenant_prefix("a"), partitions=4)
        cancel = RunCancelRequested.build(run_id=run_id, step=f"{run_id}:cancel", service="client",
                                          reason="from tenant a", requested_by="a")
        await send(stack, tenant_principal("a"), topics_a.tasks, codec_for(a.settings).encode(cancel), run_id,
                   topics_a.partition_for(run_id))
        await a.submit("What is 1 + 1?", tools=["calculator"], run_id=run_id, max_steps=4, prefetch=False)

        await approver_b.approve(run_id, step, by="someone")
        result = await b.wait(run_id, timeout=60)
        assert result.ok and result.answer == "sent", result
        async with connection(stack.database_url) as conn:
            effects = await conn.fetch("SELECT label FROM test_effects WHERE run_id = $1", run_id)
            decided_by = await conn.fetchval("SELECT decided_by FROM approval_decisions WHERE run_id = $1", run_id)
            prefix = await conn.fetchval("SELECT state->>'topic_prefix' FROM runs WHERE run_id = $1", run_id)
        assert [r["label"] for r in effects] == ["transfer 7"]
        assert (decided_by, prefix) == ("approver-b", "b.")


async def test_a_tenant_quotas_hold_for_that_tenant_only(stack):
    async with _client(stack, "a") as a, _client(stack, "b") as b:
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

        # Tenant B's cell has no such limits.
        free = await b.submit("What is 2 * 3?", tools=["calculator"], max_steps=8, prefetch=False)
        assert (await b.wait(free, timeout=60)).ok
