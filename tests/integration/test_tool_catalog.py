"""The tool catalogue on the real broker: tool workers publish their tools on the compacted ``agent.tools``,
clients and the planner read them from there, and submitting a task does not need PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import TopicPartition

from agentstream.devstack.process import free_port
from agentstream.services.tools.builtin import tools_for
from agentstream.services.worker import WorkerOptions
from agentstream.streams.catalog.tools import ToolCatalog, ToolInfo, register, registration
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.core.errors import TaskRejected, ToolCatalogUnavailable
from agentstream.streams.core.events import Event, InferenceRequested, TaskSubmitted
from agentstream.testing import Pipeline, end_offsets, isolated, read_events

pytestmark = pytest.mark.asyncio(loop_scope="module")
OPTIONS = WorkerOptions(backend="scripted", tool_modules=("agentstream.services.tools.builtin",))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings):
    async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), OPTIONS) as pipeline:
        yield pipeline


@pytest_asyncio.fixture(loop_scope="module")
async def catalog(pipe):
    catalog = ToolCatalog.for_runtime(pipe.client.runtime, ttl_s=60)
    yield catalog
    await catalog.close()


def _served() -> dict[str, ToolInfo]:
    return {t.name: t.info() for t in tools_for(OPTIONS.tool_modules, OPTIONS.builtin)}


async def test_a_tool_workers_tools_appear_in_a_clients_catalogue(pipe, catalog):
    assert "calculator" in _served()
    assert await catalog.all() == _served()
    registrations = await catalog.registrations()
    assert {r.registered_by for r in registrations} == {pipe.worker.runtime.topics.group("tools")}
    assert {r.producer.service for r in registrations} == {"tools"}


async def test_a_new_tool_is_seen_at_once_and_a_newer_version_replaces_it(pipe, catalog):
    before = await catalog.all()
    name = f"late_{uuid.uuid4().hex[:6]}"
    late = ToolInfo(name, "Registered after the catalogue was read.", {"type": "object", "properties": {}})
    await register(pipe.client.runtime, [late], worker="another-worker")
    assert name not in await catalog.all()  # within the TTL the cached view is used...
    assert await catalog.unknown([name, "calculator", "no_such_tool"]) == ["no_such_tool"]  # ...but not for an unknown name
    assert await catalog.describe([name]) == [late]

    changed = dataclasses.replace(late, description="Changed.", requires_approval=True, version=2)
    assert await register(pipe.client.runtime, [changed], worker="another-worker") == []
    assert (await catalog.refresh())[name] == changed
    assert {n: t for n, t in (await catalog.all()).items() if n != name} == before


async def test_an_older_or_conflicting_registration_cannot_change_a_tool(pipe, catalog):
    """The last worker to start does not decide: a registration with a lower version, or the same version
    with other metadata, is refused — by the worker before it publishes, and by every reader when one
    is published anyway (a worker from before versions) — and requires_approval stays on."""
    topics = pipe.client.runtime.topics
    tp = TopicPartition(topics.tools, 0)
    name = f"guarded_{uuid.uuid4().hex[:6]}"
    params = {"type": "object", "properties": {"amount": {"type": "number"}}}
    guarded = ToolInfo(name, "Move money; needs approval.", params, requires_approval=True, version=2)
    assert await register(pipe.client.runtime, [guarded], worker="new-workers") == []
    assert await register(pipe.client.runtime, [guarded], worker="new-workers") == []  # already there
    before = (await end_offsets(pipe.settings, [tp]))[tp]

    older = dataclasses.replace(guarded, description="Move money.", requires_approval=False, version=1)
    conflicting = dataclasses.replace(guarded, requires_approval=False)  # version 2, other metadata
    refused = await register(pipe.client.runtime, [older, conflicting], worker="old-workers")
    assert [(r.event.version, r.judgement) for r in refused] == [(1, "older"), (2, "conflict")]
    assert (await end_offsets(pipe.settings, [tp]))[tp] == before  # nothing was published
    assert (await catalog.refresh())[name] == guarded

    # Published regardless, as a worker from before this rule would (keyed by the tool's name; an
    # unversioned one reads as version 0): every reader still refuses them, a fresh one included.
    rogue = [registration(older, worker="old-workers"), registration(conflicting, worker="old-workers"),
             dataclasses.replace(registration(older, worker="ancient-workers"), version=0)]
    for event in rogue:
        await (await pipe.client.runtime.send(topics.tools, event, key=event.name))
    assert (await catalog.refresh())[name] == guarded
    fresh = ToolCatalog.for_runtime(pipe.client.runtime)
    try:
        assert (await fresh.describe([name])) == [guarded]
    finally:
        await fresh.close()

    # A newer version may turn approval off.
    relaxed = dataclasses.replace(guarded, requires_approval=False, version=3)
    assert await register(pipe.client.runtime, [relaxed], worker="newer-workers") == []
    assert (await catalog.refresh())[name] == relaxed


async def test_submit_succeeds_while_postgresql_is_unreachable(pipe):
    down = dataclasses.replace(pipe.settings, database_url=f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    topics = pipe.worker.runtime.topics
    tps = [TopicPartition(topics.tasks, p) for p in range(pipe.settings.partitions)]
    before = await end_offsets(pipe.settings, tps)
    async with AgentClient(down) as client:
        with pytest.raises(OSError):
            await asyncpg.connect(down.database_url, timeout=5)  # the premise: no database there
        run_id = await client.submit("What is 6 * 7?", tools=["calculator"], prefetch=False)
        everything = await client.submit("Anything.", prefetch=False)
        with pytest.raises(TaskRejected, match="no_such_tool"):
            await client.submit("What is 6 * 7?", tools=["calculator", "no_such_tool"])
    for run, check in ((run_id, lambda tools: tools == ["calculator"]),
                       (everything, lambda tools: set(_served()) <= set(tools))):  # no tools named: all of them
        event = await _published(pipe, TopicPartition(topics.tasks, topics.partition_for(run)), before, run)
        assert isinstance(event, TaskSubmitted) and check(event.tools), event
    # The pipeline (whose database is up) runs the task the database-less client submitted.
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and "42" in (result.answer or ""), result


async def test_the_planner_describes_the_registered_tools_to_the_model(pipe):
    topics = pipe.worker.runtime.topics
    tps = [TopicPartition(topics.inference_requests, p) for p in range(pipe.settings.partitions)]
    before = await end_offsets(pipe.settings, tps)
    run_id = await pipe.client.submit("What is 17 * 23?", tools=["calculator"], prefetch=False)
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok, result
    request = await _published(pipe, TopicPartition(topics.inference_requests, topics.partition_for(run_id)),
                               before, run_id)
    assert isinstance(request, InferenceRequested)
    calculator = _served()["calculator"]
    assert any(f"calls calculator: {calculator.description}" in m.content for m in request.messages), request
    branches = json.loads(request.response_schema or "{}")["anyOf"]
    assert [b["properties"]["arguments"]["properties"] for b in branches
            if b["properties"]["action"] == {"const": "tool"}] == [calculator.parameters["properties"]]


async def _published(pipe, tp: TopicPartition, since: dict[TopicPartition, int], run_id: str) -> Event:
    """The first event of ``run_id`` on ``tp`` between the offset ``since`` names and the end (every event
    of interest was acknowledged before this is called)."""
    end = (await end_offsets(pipe.settings, [tp]))[tp]
    events = await read_events(pipe.settings, tp, since[tp], expect=end - since[tp])
    return next(e for e in events if e.run_id == run_id)


async def test_a_catalogue_without_its_topic_or_broker_fails_within_its_timeout(pipe):
    absent = ToolCatalog(pipe.settings.kafka_bootstrap, f"t{uuid.uuid4().hex[:8]}.agent.tools",
                         pipe.client.runtime.codec, timeout_s=1, auth=pipe.settings.kafka_auth)
    t0 = time.monotonic()
    with pytest.raises(ToolCatalogUnavailable, match="to exist"):
        await absent.unknown(["calculator"])
    assert time.monotonic() - t0 < 3
    await absent.close()

    no_broker = ToolCatalog(f"127.0.0.1:{free_port()}", "agent.tools", pipe.client.runtime.codec, timeout_s=1,
                            auth=pipe.settings.kafka_auth)
    with pytest.raises(ToolCatalogUnavailable, match="the broker"):
        await no_broker.all()
    assert time.monotonic() - t0 < 6
    await no_broker.close()
