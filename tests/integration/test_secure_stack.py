"""Kafka with authentication and ACLs (``agentstream dev up --secure``), tried as a hostile client would.

A private broker with SASL/SCRAM and the StandardAuthorizer (``PrivateStack(secure=True)``), the ACLs
``agentstream/ops/acls.py`` derives from the topic contract, and workers as separate processes, each
authenticating as its own service with its password given by file: an unauthenticated client and a
wrong password are refused; the client principal cannot publish a tool request (nor read one), and no
principal can write or read more than its ACLs say; a run still completes end to end; a forged tool call
published with a worker's own principal is still refused by the tool service; and no password shows in
any log or CLI output; a replay runs as its own principal. On the database side (PostgreSQL with password authentication): each service runs
with its own login, limited to its tables; the client's login
reads runs but writes nothing and cannot approve; a decision published to Kafka without a record is
refused by the planner; an approver's login decides, and the run records that login as who approved.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from agentstream.devstack.private import PrivateStack
from agentstream.devstack.secure import DATABASE_LOGINS
from agentstream.ops.acls import PRINCIPALS, Operation, Resource, acl_bindings
from agentstream.replay.rerun import rerun
from agentstream.services.worker import WorkerOptions
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.core.errors import NotAnApprover
from agentstream.streams.core.events import ApprovalDecided, ToolCallRequested
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import wait_awaiting_approval
from tests.integration.acl_probes import can_read, can_write, connection, dead_letter, send
from tests.integration.pipeline_tools import EFFECTS_TABLE
from tests.integration.processes import ROOT, start_worker, stop, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")
PREFIX = "sec."


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory) -> AsyncIterator[PrivateStack]:
    private = PrivateStack(tmp_path_factory.mktemp("secure") / "state", secure=True)
    await private.start()
    try:
        await private.grant(Topics(PREFIX, partitions=4))
        async with connection(private.database_url) as conn:  # the client's login reads its own cell's runs
            await conn.execute("INSERT INTO tenant_logins (login, topic_prefix) VALUES ('client', $1)", PREFIX)
        yield private
    finally:
        await private.close()




async def test_an_unauthenticated_client_and_a_wrong_password_are_refused(stack):
    for auth in (KafkaAuth(), KafkaAuth(security_protocol="SASL_PLAINTEXT", username="client", password="guess")):
        producer = AIOKafkaProducer(**kafka_options(stack.bootstrap, auth), request_timeout_ms=3000,
                                    metadata_max_age_ms=3000)
        with pytest.raises(KafkaError):
            await producer.start()  # no metadata without authenticating: nothing can be sent
        await producer.stop()






async def test_the_client_cannot_publish_or_read_tool_requests(stack):
    topics = Topics("acl1.", partitions=1)
    await stack.grant(topics)
    assert not await can_write(stack, "client", topics.tool_requests)
    assert not await can_read(stack, "client", topics.tool_requests)
    assert not await can_write(stack, "client", topics.tool_results)
    assert await can_write(stack, "client", topics.tasks)
    assert await can_read(stack, "client", topics.outcomes)
    # the tool service: reads tool requests, writes tool results — and cannot ask the model or plan
    assert await can_read(stack, "tools", topics.tool_requests)
    assert await can_write(stack, "tools", topics.tool_results)
    assert not await can_write(stack, "tools", topics.inference_requests)
    assert not await can_write(stack, "tools", topics.tasks)
    assert not await can_read(stack, "tools", topics.outcomes)


async def test_every_principal_writes_exactly_the_topics_its_acls_name(stack):
    topics = Topics("acl2.", partitions=1)
    await stack.grant(topics)
    bindings = acl_bindings(topics)
    names = [s.name for s in topics.specs()]
    for principal in PRINCIPALS:
        allowed = {b.name for b in bindings if b.principal == principal and b.resource is Resource.TOPIC
                   and b.operation in (Operation.WRITE, Operation.ALL)
                   and b.pattern.name == "LITERAL"}
        for topic in names:
            assert await can_write(stack, principal, topic) == (topic in allowed), (principal, topic)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def workers(stack, tmp_path_factory) -> AsyncIterator[list[Path]]:
    """Two planners, inference, tools (with the test tools) and retrieval, each as its own principal, as
    separate processes; yields their logs."""
    async with connection(stack.database_url) as conn:
        await conn.execute(EFFECTS_TABLE)  # a tool's own table, granted to the tool service's role
        await conn.execute("GRANT SELECT, INSERT ON test_effects TO agentstream_tools; "
                           "GRANT USAGE ON SEQUENCE test_effects_id_seq TO agentstream_tools")
    settings = stack.settings(topic_prefix=PREFIX)
    logs: list[Path] = []
    procs = []
    directory = tmp_path_factory.mktemp("workers")
    for service in ("planner", "planner", "inference", "tools", "retrieval"):
        log = directory / f"{service}-{len(procs)}.log"
        logs.append(log)
        args = ["--tools", "agentstream.services.tools.builtin", "--tools", "tests.integration.pipeline_tools"] \
            if service == "tools" else []
        procs.append(start_worker(settings, service, log, *args, **stack.env(service)))
    try:
        client = AgentClient(stack.settings(topic_prefix=PREFIX, principal="client", database_login="client"))
        await client.start()
        catalog = ToolCatalog.for_runtime(client.runtime, ttl_s=0.0)
        try:  # the tool worker has registered its tools (a task's default tools are those registered)
            await wait_for(lambda: _has(catalog, "transfer"), 90, "the test tools' registration")
        finally:
            await catalog.close()
            await client.close()
        yield logs
    finally:
        for proc in procs:
            stop(proc)


async def test_a_run_completes_with_each_service_as_its_own_principal(stack, workers):
    settings = stack.settings(topic_prefix=PREFIX, principal="client", database_login="client")
    async with AgentClient(settings) as client:
        run_id = await client.submit("What is 17 * 23? Use the calculator.", tools=["calculator"], prefetch=False)
        result = await client.wait(run_id, timeout=120)
        assert result.ok and "391" in (result.answer or ""), result
        details = await client.status(run_id)  # read with the client's own, read-only login
        assert details is not None and details["status"] == "completed"

    # Each service ran with its own database login, and a login has only its service's tables.
    async with connection(stack.database_url_for("inference")) as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT count(*) FROM runs")
    async with connection(stack.database_url_for("tools")) as conn:
        assert await conn.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) == "completed"
        # (steps: how an idempotent tool's late copy is told from a forgery, streams/store/tool_calls.py)
        assert await conn.fetchval("SELECT count(*) FROM steps WHERE run_id = $1 AND kind = 'tool'", run_id) == 1
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE runs SET status = 'failed' WHERE run_id = $1", run_id)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT count(*) FROM events")  # (documents it reads: sql_query's corpus)
    async with connection(stack.database_url_for("planner")) as conn:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DELETE FROM tool_calls")

    # A worker's principal may publish tool requests (the planner's does); the tool service still checks
    # each against its run: a call for a run that does not exist runs nothing.
    forged = ToolCallRequested.build(run_id=(ghost := new_run_id()), step=f"{ghost}:1:tool",
                                     service="attacker", tool="calculator",
                                     arguments=json.dumps({"expression": "1+1"}))
    topics = Topics.of(settings)
    meta = await send(stack, "planner", topics.tool_requests, codec_for(settings).encode(forged), ghost,
                       topics.partition_for(ghost))
    letter = await dead_letter(stack, PREFIX, topics.tool_requests, meta)
    assert (letter.error_kind, letter.consumer) == ("refused", "tools"), letter

    # A replay runs as the replay principal: it reads the recorded topics and runs a pipeline of its own
    # under `replay.<id>.`, topics and groups it may create (and deletes afterwards).
    replayed = await rerun(stack.settings(topic_prefix=PREFIX, principal="replay"), run_id,
                           options=WorkerOptions(backend="scripted"), timeout=60)
    assert replayed.finished and replayed.result.ok and replayed.same_decisions, replayed.diff.to_dict()


async def test_approvals_are_recorded_by_an_approver_login_not_by_what_a_client_says(stack, workers):
    reader = AgentClient(stack.settings(topic_prefix=PREFIX, principal="client", database_login="client"))
    approver = AgentClient(stack.settings(topic_prefix=PREFIX, principal="client", database_login="approver"))
    async with reader, approver:
        run_id = await reader.submit('[[tool:transfer {"amount": 5}]] [[answer:sent]]', tools=["transfer"],
                                     prefetch=False)
        step = (await wait_awaiting_approval(reader, run_id, 30))["step_id"]
        pool = await reader.pool()
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await pool.execute("UPDATE runs SET status = 'completed' WHERE run_id = $1", run_id)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await pool.execute("INSERT INTO approval_decisions (run_id, step_id, approved, decided_by) "
                               "VALUES ($1, $2, true, 'boss')", run_id, step)
        with pytest.raises(NotAnApprover):
            await reader.approve(run_id, step, by="boss")

        # The client principal may write the tasks topic, so it can publish a decision; without a record
        # the planner refuses it and the run still waits.
        topics = Topics.of(reader.settings)
        forged = ApprovalDecided.build(run_id=run_id, step=step, service="client", approved=True, reason="",
                                       decided_by="boss")
        meta = await send(stack, "client", topics.tasks, codec_for(reader.settings).encode(forged), run_id,
                           topics.partition_for(run_id))
        letter = await dead_letter(stack, PREFIX, topics.tasks, meta)
        assert (letter.error_kind, letter.consumer) == ("refused", "planner"), letter
        assert "no decision" in letter.reason
        assert [w["step_id"] for w in await reader.awaiting_approval() if w["run_id"] == run_id] == [step]
        assert await _effects(stack, run_id) == []

        # A worker's own principal (the planner's may write tool requests) publishing a call for a tool
        # outside the run's tools, at the run's pending step: the tool service refuses it.
        sneaked = ToolCallRequested.build(run_id=run_id, step=step, service="attacker", tool="effect",
                                          arguments=json.dumps({"label": "sneaked"}))
        meta = await send(stack, "planner", topics.tool_requests, codec_for(reader.settings).encode(sneaked), run_id,
                          topics.partition_for(run_id))
        letter = await dead_letter(stack, PREFIX, topics.tool_requests, meta)
        assert (letter.error_kind, letter.consumer) == ("refused", "tools"), letter
        assert letter.reason.startswith("tool_not_allowed"), letter.reason
        assert await _effects(stack, run_id) == []

        await approver.approve(run_id, step, by="boss")  # `by` is not believed: the login is recorded
        result = await reader.wait(run_id, timeout=60)
        assert result.ok and result.answer == "sent", result
        assert await _effects(stack, run_id) == ["transfer 5"]
        async with connection(stack.database_url) as conn:
            decided_by = await conn.fetchval("SELECT decided_by FROM approval_decisions WHERE run_id = $1", run_id)
            in_history = await conn.fetch("SELECT payload->>'decided_by' AS who FROM events WHERE run_id = $1 AND "
                                          "event_type = 'ApprovalDecided'", run_id)
        assert decided_by == "approver", decided_by
        assert [r["who"] for r in in_history] == ["approver"]  # the refused forgery is not in the history


async def test_no_password_in_logs_or_cli_output(stack, workers):
    cli = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "agentstream.cli", "dev", "status", "--json"],
                                  cwd=ROOT, env={**os.environ, **stack.env("client")}, capture_output=True, text=True,
                                  timeout=60)
    text = "\n".join(log.read_text() for log in workers) + cli.stdout + cli.stderr
    assert "Authenticated as planner" in text  # the logs are the workers' own, on the secure broker
    for password in _passwords(stack):
        assert password not in text




async def _effects(stack: PrivateStack, run_id: str) -> list[str]:
    async with connection(stack.database_url) as conn:
        return [r["label"] for r in await conn.fetch(
            "SELECT label FROM test_effects WHERE run_id = $1 ORDER BY id", run_id)]




async def _has(catalog: ToolCatalog, tool: str) -> bool:
    return tool in await catalog.refresh()


def _passwords(stack: PrivateStack) -> list[str]:
    assert stack.secrets is not None
    return [stack.secrets.password(p) for p in ("admin", *PRINCIPALS)] + [
        stack.secrets.db_password(login) for login in DATABASE_LOGINS]
