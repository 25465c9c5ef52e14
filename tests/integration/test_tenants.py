"""Two tenants on one secure broker and database (docs/security.md, "Tenants"), tried as tenant A against
tenant B: A cannot write B's intake or read B's outcomes and tokens (prefix ACLs for its own principal);
A's database login does not see B's runs, steps or events (row-level security); A's approver cannot decide
on B's waiting call; a cancellation or a task naming B's run, sent through A's own cell, leaves B's run
alone; B's own approver decides and B's run completes once."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from agentstream.devstack.private import PrivateStack
from agentstream.streams.acls import tenant_prefix, tenant_principal
from agentstream.streams.client import AgentClient, NotAnApprover
from agentstream.streams.codec import codec_for
from agentstream.streams.events import RunCancelRequested
from agentstream.streams.kafka_auth import kafka_options
from agentstream.streams.tool_catalog import ToolCatalog
from agentstream.streams.topics import Topics
from agentstream.testing import wait_awaiting_approval
from tests.integration.pipeline_tools import EFFECTS_TABLE
from tests.integration.processes import start_worker, stop, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")
TENANTS = ("a", "b")
TOOLS = ["--tools", "agentstream.services.tools.builtin", "--tools", "tests.integration.pipeline_tools"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory) -> AsyncIterator[PrivateStack]:
    """The stack, each tenant's cell (its topics and ACLs), and a worker process per cell running the four
    services as the `worker` principal with its own database login."""
    directory = tmp_path_factory.mktemp("tenants")
    private = PrivateStack(directory / "state", secure=True, tenants=TENANTS)
    await private.start()
    procs = []
    try:
        async with _connection(private.database_url) as conn:
            await conn.execute(EFFECTS_TABLE)
            await conn.execute("GRANT SELECT, INSERT ON test_effects TO agentstream_tools; "
                               "GRANT USAGE ON SEQUENCE test_effects_id_seq TO agentstream_tools")
        for tenant in TENANTS:
            await private.grant(Topics(tenant_prefix(tenant), partitions=4), client=tenant_principal(tenant))
            settings = private.settings(topic_prefix=tenant_prefix(tenant))
            procs.append(start_worker(settings, "all", directory / f"worker-{tenant}.log", *TOOLS,
                                      **private.env("worker")))
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


@contextlib.asynccontextmanager
async def _connection(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()


async def _can_write(stack: PrivateStack, tenant: str, topic: str) -> bool:
    producer = AIOKafkaProducer(**kafka_options(stack.bootstrap, stack.auth(tenant_principal(tenant))), acks="all",
                                request_timeout_ms=5000)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"not an event", key=b"tenant-check")
        return True
    except TopicAuthorizationFailedError:
        return False
    finally:
        await producer.stop()


async def _can_read(stack: PrivateStack, tenant: str, topic: str) -> bool:
    """Whether the tenant gets a record the administrator just wrote."""
    producer = AIOKafkaProducer(**kafka_options(stack.bootstrap, stack.auth("admin")), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"marker", key=b"tenant-check", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(**kafka_options(stack.bootstrap, stack.auth(tenant_principal(tenant))),
                                enable_auto_commit=False, auto_offset_reset="earliest", request_timeout_ms=5000)
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        for _ in range(6):
            try:
                if any((await consumer.getmany(timeout_ms=500)).values()):
                    return True
            except TopicAuthorizationFailedError:
                return False
        return False
    finally:
        await consumer.stop()


async def test_a_tenant_reaches_its_own_topics_only(stack):
    a, b = Topics(tenant_prefix("a")), Topics(tenant_prefix("b"))
    assert await _can_write(stack, "a", a.tasks)
    assert await _can_read(stack, "a", a.outcomes)
    assert not await _can_write(stack, "a", b.tasks)
    assert not await _can_read(stack, "a", b.outcomes)
    assert not await _can_read(stack, "a", b.tokens)
    assert not await _can_write(stack, "a", a.tool_requests)  # nor another party's topics in its own cell


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
        async with _connection(stack.database_url_for(tenant_principal("a"))) as conn:
            assert await conn.fetchval("SELECT count(*) FROM steps WHERE run_id = $1", run_id) == 0

        # Decisions: A's approver may not decide on B's run.
        with pytest.raises(NotAnApprover):
            await approver_a.approve(run_id, step)

        # A cancellation and a task naming B's run, through A's own cell: A's planner does not touch
        # another cell's run.
        topics_a = Topics(tenant_prefix("a"), partitions=4)
        cancel = RunCancelRequested.build(run_id=run_id, step=f"{run_id}:cancel", service="client",
                                          reason="from tenant a", requested_by="a")
        await _send(stack, topics_a.tasks, codec_for(a.settings).encode(cancel), run_id, topics_a.partition_for(run_id))
        await a.submit("What is 1 + 1?", tools=["calculator"], run_id=run_id, prefetch=False)

        await approver_b.approve(run_id, step, by="someone")
        result = await b.wait(run_id, timeout=60)
        assert result.ok and result.answer == "sent", result
        async with _connection(stack.database_url) as conn:
            effects = await conn.fetch("SELECT label FROM test_effects WHERE run_id = $1", run_id)
            decided_by = await conn.fetchval("SELECT decided_by FROM approval_decisions WHERE run_id = $1", run_id)
            prefix = await conn.fetchval("SELECT state->>'topic_prefix' FROM runs WHERE run_id = $1", run_id)
        assert [r["label"] for r in effects] == ["transfer 7"]
        assert (decided_by, prefix) == ("approver-b", "b.")


async def _send(stack: PrivateStack, topic: str, value: bytes, key: str, partition: int) -> None:
    producer = AIOKafkaProducer(**kafka_options(stack.bootstrap, stack.auth(tenant_principal("a"))), acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key.encode(), partition=partition)
    finally:
        await producer.stop()
