"""Planner features end to end: speculative retrieval (prefetch) and human approval of tool calls."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import pytest_asyncio

from agentstream.services.worker import WorkerOptions
from agentstream.testing import Pipeline, isolated, wait_awaiting_approval

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")
DOC = "Log compaction keeps the latest value for every key of a Kafka topic and drops older ones."


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings, effects_table):
    async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."),
                              WorkerOptions(backend="scripted", tool_modules=TOOLS)) as pipeline:
        pool = await pipeline.client.pool()
        await pool.execute(
            """INSERT INTO documents (collection, source, content, content_hash) VALUES ('default', 'kafka.md', $1, $2)
               ON CONFLICT DO NOTHING""", DOC, uuid.uuid4().hex)
        yield pipeline


async def test_prefetch_answers_the_models_retrieval(pipe):
    task = "[[slow:250]] [[retrieve:kafka compaction]] [[answer:done]] How does kafka compaction work?"
    with_prefetch = await pipe.client.submit(task, tools=[])
    without = await pipe.client.submit(task, tools=[], prefetch=False)
    fast, slow = await asyncio.gather(pipe.client.wait(with_prefetch, timeout=30), pipe.client.wait(without, timeout=30))
    assert fast.ok and slow.ok

    status = await pipe.client.status(with_prefetch)
    kinds = [(s["step_index"], s["kind"]) for s in status["steps"]]
    assert kinds == [(-1, "prefetch"), (0, "model"), (1, "retrieval"), (2, "model")]
    retrieval = status["steps"][2]
    assert retrieval["request"] == {"query": "kafka compaction", "from_prefetch": True}
    assert retrieval["result"]["from_prefetch"] and retrieval["result"]["saved_ms"] > 0
    assert DOC in retrieval["result"]["passages"][0]["text"]
    events = [e["event_type"] for e in await pipe.client.events(with_prefetch)]
    assert events.count("RetrievalRequested") == 1  # only the prefetch went to the retrieval service

    plain = await pipe.client.status(without)
    assert [s["kind"] for s in plain["steps"]] == ["model", "retrieval", "model"]
    assert plain["steps"][1]["result"]["passages"][0]["text"] == DOC  # same passage, one round trip later


async def test_tool_call_waits_for_approval_then_runs_once(pipe):
    run_id = await pipe.client.submit('[[tool:transfer {"amount": 5}]] [[answer:sent]]', tools=["transfer"],
                                      prefetch=False)
    waiting = await wait_awaiting_approval(pipe.client, run_id, 10)
    assert waiting["tool"] == "transfer" and waiting["arguments"] == {"amount": 5}
    pool = await pipe.client.pool()
    assert await pool.fetchval("SELECT count(*) FROM test_effects WHERE run_id = $1", run_id) == 0
    other = await pipe.client.submit("What is 2 + 2?", tools=["calculator"])  # nothing is blocked meanwhile
    assert (await pipe.client.wait(other, timeout=10)).ok

    await pipe.client.approve(run_id, waiting["step_id"], by="ana")
    await pipe.client.approve(run_id, waiting["step_id"], by="ana")  # a second click changes nothing
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.answer == "sent"
    assert await pool.fetchval("SELECT count(*) FROM test_effects WHERE run_id = $1", run_id) == 1


async def test_denied_tool_call_is_told_to_the_model(pipe):
    run_id = await pipe.client.submit('[[tool:transfer {"amount": 9}]] [[answer:not sent]]', tools=["transfer"],
                                      prefetch=False)
    waiting = await wait_awaiting_approval(pipe.client, run_id, 10)
    await pipe.client.deny(run_id, waiting["step_id"], reason="over the limit", by="ana")
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.answer == "not sent"
    pool = await pipe.client.pool()
    assert await pool.fetchval("SELECT count(*) FROM test_effects WHERE run_id = $1", run_id) == 0
    state = await pool.fetchval("SELECT state::text FROM runs WHERE run_id = $1", run_id)
    assert "denied by a person: over the limit" in state


async def test_deadline_fails_a_run_waiting_for_approval(pipe):
    """Nothing else will ever answer a run that waits for a person: the planner's own timer fails it."""
    run_id = await pipe.client.submit('[[tool:transfer {"amount": 1}]] [[answer:x]]', tools=["transfer"],
                                      prefetch=False, deadline=1.0)
    await wait_awaiting_approval(pipe.client, run_id, 10)
    t0 = time.monotonic()
    result = await pipe.client.wait(run_id, timeout=10)
    assert result.status == "failed" and result.error_code == "deadline_exceeded", result
    assert time.monotonic() - t0 < 2.0


async def test_a_planner_on_another_prefix_never_adopts_the_run(pipe):
    """Replays and tests share the database with production: a planner joining its group loads the
    active runs of its own topic prefix only, or it would expire (and publish for) runs it does not own."""
    run_id = await pipe.client.submit('[[tool:transfer {"amount": 2}]] [[answer:x]]', tools=["transfer"],
                                      prefetch=False, deadline=60.0)
    waiting = await wait_awaiting_approval(pipe.client, run_id, 10)
    async with Pipeline.start(isolated(pipe.settings, f"t{uuid.uuid4().hex[:8]}."),
                              WorkerOptions(backend="scripted", tool_modules=TOOLS),
                              services=("planner",)) as other:
        assert other.worker.planner.assigned  # it joined and loaded the active runs of its partitions
        assert run_id not in other.worker.planner.cache
    assert run_id in pipe.worker.planner.cache
    await pipe.client.deny(run_id, waiting["step_id"], reason="done", by="test")
    assert (await pipe.client.wait(run_id, timeout=30)).ok
