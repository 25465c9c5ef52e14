"""Limits and bad input, end to end on the real broker and database: big payloads travel as claim
checks, NUL characters never fail a write, a task from a third-party producer (another partitioner,
ids that are not UUIDs) is answered, and one run's bad data never fails another run's transition."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer, TopicPartition

from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.errors import TaskRejected, TransitionRejected
from agentstream.streams.core.events import ClaimCheck, TaskSubmitted, ToolCallCompleted
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.store.history import RunRow, Transition, TransitionStore, event_uuid
from agentstream.testing import Pipeline, end_offsets, isolated, read_events
from tests.integration.partition_reads import read_to_end

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings, effects_table):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.")
    async with Pipeline.start(s, WorkerOptions(backend="scripted", tool_modules=TOOLS)) as pipeline:
        yield pipeline


async def test_a_2_mb_tool_result_travels_as_a_claim_check(pipe):
    topics = pipe.worker.runtime.topics
    size = 2 * 1024 * 1024
    tps = [TopicPartition(topics.tool_results, p) for p in range(pipe.settings.partitions)]
    starts = await end_offsets(pipe.settings, tps)
    run_id = await pipe.client.submit(f'[[tool:big {{"size": {size}}}]] [[answer:got it]]', tools=["big"],
                                      prefetch=False)
    tp = TopicPartition(topics.tool_results, topics.partition_for(run_id))
    start = starts[tp]
    result = await pipe.client.wait(run_id, timeout=60)
    assert result.ok and result.answer == "got it", result

    on_topic = [e for e in await read_events(pipe.settings, tp, start, expect=1, timeout=5) if e.run_id == run_id]
    (claim,) = on_topic
    assert isinstance(claim, ClaimCheck) and claim.event_type.endswith("ToolCallCompleted")
    pool = await pipe.client.pool()
    body = await pool.fetchval("SELECT body FROM event_payloads WHERE digest = $1", claim.digest)
    assert len(body) == claim.size > size and hashlib.sha256(body).hexdigest() == claim.digest
    completed = codec_for(pipe.settings).decode(body)
    assert isinstance(completed, ToolCallCompleted) and len(json.loads(completed.result)) == size
    stored = await pool.fetchval("SELECT length(result->>'result') FROM steps WHERE step_id = $1", claim.step_id)
    assert stored == len(completed.result)  # the whole result is in the history; the model saw a preview


async def test_every_event_over_the_limit_is_claim_checked(settings, effects_table):
    """With a tiny limit, model requests (the conversation), snapshots and results all go through
    PostgreSQL, and runs still complete."""
    s = replace(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), max_event_bytes=512)
    async with Pipeline.start(s, WorkerOptions(backend="scripted", tool_modules=TOOLS)) as small:
        run_ids = [await small.client.submit("What is 17 * 23?", tools=["calculator"]) for _ in range(5)]
        results = await asyncio.gather(*(small.client.wait(r, timeout=60) for r in run_ids))
        assert all(r.ok and "391" in (r.answer or "") for r in results), results
        topics = small.worker.runtime.topics
        tp = TopicPartition(topics.inference_requests, topics.partition_for(run_ids[0]))
        requests = [e for e in await read_to_end(s, [tp]) if e.run_id == run_ids[0]]  # the run has ended
        assert requests and all(isinstance(e, ClaimCheck) for e in requests)


async def test_nul_characters(pipe):
    with pytest.raises(TaskRejected, match="NUL"):
        await pipe.client.submit("What is\x00 2 + 2?", tools=["calculator"])
    with pytest.raises(TaskRejected, match="surrogate"):
        await pipe.client.submit("What is 2 + 2?\ud800", tools=["calculator"])
    # A tool's arguments and result with NUL (the model can produce them): stored with U+FFFD, while
    # other runs' transitions written in the same group commits go through.
    noisy = [await pipe.client.submit('[[tool:echo {"text": "a\\u0000b"}]]', tools=["echo"]) for _ in range(5)]
    calm = [await pipe.client.submit("What is 2 + 3?", tools=["calculator"]) for _ in range(5)]
    results = await asyncio.gather(*(pipe.client.wait(r, timeout=60) for r in noisy + calm))
    assert all(r.ok for r in results), results
    assert all('"a\\u0000b"' in (r.answer or "") for r in results[:5])  # the tool's JSON result, quoted
    pool = await pipe.client.pool()
    stored = await pool.fetch("SELECT arguments->>'text' AS t FROM tool_calls WHERE run_id = ANY($1)", noisy)
    assert [r["t"] for r in stored] == ["a\ufffdb"] * 5


async def _publish_raw(pipe, task: TaskSubmitted, partition: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=pipe.settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(pipe.worker.runtime.topics.tasks, codec_for(pipe.settings).encode(task),
                                     key=task.run_id.encode(), partition=partition)
    finally:
        await producer.stop()


async def test_a_third_party_task_on_another_partition_is_routed_and_answered(pipe):
    topics = pipe.worker.runtime.topics
    await pipe.client.watch_outcomes()
    good = new_run_id()
    elsewhere = (topics.partition_for(good) + 1) % pipe.settings.partitions
    waiting = asyncio.create_task(pipe.client.wait(good, timeout=60))
    await _publish_raw(pipe, TaskSubmitted.build(run_id=good, step=f"{good}:task", service="other",
                                                 task="What is 5 * 5?", tools=["calculator"], max_steps=5), elsewhere)
    result = await waiting
    assert result.ok and "25" in (result.answer or ""), result
    events = await pipe.client.events(good)
    assert {e["partition"] for e in events if e["topic"] == topics.tasks} == {topics.partition_for(good)}

    # An event id that is not a UUID is accepted (history keeps it as a UUIDv5 of it); a deadline already
    # past is answered with the reason, not only dead-lettered.
    foreign = new_run_id()
    waiting = asyncio.create_task(pipe.client.wait(foreign, timeout=60))
    task = TaskSubmitted.build(run_id=foreign, step=f"{foreign}:task", service="other", task="What is 1 + 1?",
                               tools=["calculator"], max_steps=5)
    await _publish_raw(pipe, replace(task, event_id="not-a-uuid"), elsewhere)
    result = await waiting
    assert result.ok and "2" in (result.answer or ""), result
    recorded = [e for e in await pipe.client.events(foreign) if e["event_type"] == "TaskSubmitted"]
    assert [e["event_id"] for e in recorded] == [event_uuid("not-a-uuid")]

    late = new_run_id()
    waiting = asyncio.create_task(pipe.client.wait(late, timeout=60))
    await _publish_raw(pipe, TaskSubmitted.build(run_id=late, step=f"{late}:task", service="other", task="Hi",
                                                 max_steps=5, deadline=datetime(2020, 1, 1, tzinfo=UTC)),
                       topics.partition_for(late))
    result = await waiting
    assert result.status == "failed" and result.error_code == "deadline_exceeded", result


async def test_one_transitions_bad_data_does_not_fail_the_others(pipe):
    """PostgreSQL refuses one transition of a group commit (an integer out of range): that one raises,
    the others of the same batch are written."""
    store = TransitionStore(await pipe.client.pool(), max_batch=10)
    now = datetime.now(UTC)

    def transition(run_id: str, step_count: int) -> Transition:
        return Transition(run=RunRow(run_id=run_id, status="running", task="t", state={"x": 1}, version=1,
                                     expected_version=None, step_count=step_count, answer=None, error_code=None,
                                     error=None, traceparent=None, submitted_at=now, updated_at=now, finished_at=None))

    ids = [new_run_id() for _ in range(6)]
    outcomes = await asyncio.gather(*(store.write(transition(r, 2**40 if i == 3 else 1)) for i, r in enumerate(ids)),
                                    return_exceptions=True)
    assert [type(o).__name__ for o in outcomes] == ["NoneType"] * 3 + ["TransitionRejected"] + ["NoneType"] * 2
    assert isinstance(outcomes[3], TransitionRejected) and ids[3] in str(outcomes[3])
    written = await (await pipe.client.pool()).fetchval("SELECT count(*) FROM runs WHERE run_id = ANY($1)", ids)
    assert written == 5


async def test_a_producer_whose_task_cannot_be_read_is_told_on_agent_outcomes(pipe):
    """An unreadable record keyed by a new run id: dead-lettered, and its producer gets a RunFailed for that
    run (it would otherwise wait forever); one keyed by a live run does not end that run."""
    await pipe.client.watch_outcomes()
    refused = new_run_id()
    live = await pipe.client.submit("[[slow:1500]] [[answer:still here]]", tools=[], prefetch=False)
    producer = AIOKafkaProducer(bootstrap_servers=pipe.settings.kafka_bootstrap)
    await producer.start()
    try:
        for key in (refused, live):  # not Avro at all: no magic byte, no schema id
            await producer.send_and_wait(pipe.client.topics.tasks, b"{not avro}", key=key.encode())
    finally:
        await producer.stop()
    result = await pipe.client.wait(refused, timeout=30)
    assert (result.status, result.error_code) == ("failed", "invalid_task"), result
    assert "could not become a run" in (result.error or "") and "dead-lettered" in (result.error or "")
    assert (await pipe.client.wait(live, timeout=30)).answer == "still here"  # the live run was not ended
