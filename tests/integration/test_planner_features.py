"""Planner features end to end: speculative retrieval (prefetch), human approval of tool calls, and sessions."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid

import pytest
import pytest_asyncio

from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.sessions import SessionSettings
from agentstream.streams.core.events import SessionUpdated
from agentstream.testing import Pipeline, isolated, wait_awaiting_approval
from tests.integration.processes import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")
DOC = "Log compaction keeps the latest value for every key of a Kafka topic and drops older ones."


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings, effects_table):
    # Sessions over their budget are summarised (the default drops: tests/unit/test_sessions.py).
    summarising = dataclasses.replace(settings, sessions=SessionSettings(token_budget=600, overflow="summarise"))
    async with Pipeline.start(isolated(summarising, f"t{uuid.uuid4().hex[:8]}."),
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


# -- sessions (conversations) -------------------------------------------------------------------------
async def _mirror(pipe, session: str) -> list[bytes | None]:
    """The values ``agent.sessions`` holds for ``session``'s key, oldest first (None: a tombstone)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topics = pipe.client.topics
    tp = TopicPartition(topics.sessions, topics.partition_for(session))
    consumer = AIOKafkaConsumer(**pipe.settings.kafka_options(), enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes | None] = []
        while await consumer.position(tp) < end:
            for record in (await consumer.getmany(tp, timeout_ms=1000)).get(tp, []):
                if record.key == session.encode():
                    values.append(record.value)
        return values
    finally:
        await consumer.stop()


async def _mirrored(pipe, session: str, turns: int) -> SessionUpdated:
    """The session's latest ``SessionUpdated`` once it holds ``turns`` turns (it is published just after the
    turn's outcome)."""
    for _ in range(50):
        values = [v for v in await _mirror(pipe, session) if v is not None]
        if values and len((latest := pipe.client.runtime.codec.decode(values[-1])).turns) == turns:
            return latest
        await asyncio.sleep(0.1)
    raise AssertionError(f"agent.sessions never held {turns} turns of {session}")


async def test_a_sessions_third_turn_sees_the_first_two(pipe):
    session = f"chat-{uuid.uuid4().hex[:6]}"
    answers = []
    for text in ("[[answer:alpha]] my name is Ada", "[[answer:beta]] I live in Paris", "[[recall]] who am I?"):
        run_id = await pipe.client.submit(text, tools=[], prefetch=False, session=session)
        assert pipe.client.topics.partition_for(run_id) == pipe.client.topics.partition_for(session)
        answers.append((await pipe.client.wait(run_id, timeout=30)).answer)
    assert answers == ["alpha", "beta", "recall: alpha | beta"]
    details = await pipe.client.sessions.show(session)
    assert details is not None and details.going == []
    assert [t["answer"] for t in details.row.turns] == answers and details.row.turns[0]["user"].endswith("Ada")
    # the turn's own run records the transcript it started from (what `replay rerun` feeds it again)
    pool = await pipe.client.pool()
    started = await pool.fetchval("SELECT state->'session_turns' FROM runs WHERE run_id = $1", run_id)
    assert [t["answer"] for t in json.loads(started)] == ["alpha", "beta"]
    assert [t.answer for t in (await _mirrored(pipe, session, 3)).turns] == answers  # the compacted mirror


async def test_a_session_over_its_budget_is_summarised_by_a_model_step_and_the_turn_sees_the_summary(pipe):
    session = f"chat-{uuid.uuid4().hex[:6]}"
    padding = " and more" * 80  # ~240 estimated tokens a turn: the third turn's transcript is over 600
    answers = []
    for text in ("[[answer:alpha]] my name is Ada", "[[answer:beta]] I live in Paris", "[[answer:gamma]] I like tea",
                 "[[recall]] who am I?"):
        run_id = await pipe.client.submit(text + padding, tools=[], prefetch=False, session=session, max_steps=1)
        answers.append((await pipe.client.wait(run_id, timeout=30)).answer)
    assert answers[:3] == ["alpha", "beta", "gamma"]
    assert answers[3] == "recall: [earlier: alpha, beta] gamma"  # the summary in the instructions, then a turn
    pool = await pipe.client.pool()
    steps = await pool.fetch("SELECT step_id, request FROM steps WHERE run_id = $1 AND kind = 'model' ORDER BY step_index",
                             run_id)
    assert [r["step_id"] for r in steps] == [f"{run_id}:0:model", f"{run_id}:1:model"]  # the summary step first
    details = await pipe.client.sessions.show(session)
    assert details is not None and details.row.summary == "earlier: alpha, beta" and details.row.dropped == 2
    assert [t["answer"] for t in details.row.turns] == answers[2:]
    assert (await _mirrored(pipe, session, 2)).summary == "earlier: alpha, beta"


async def test_two_turns_submitted_at_once_both_run_in_order(pipe):
    session = f"chat-{uuid.uuid4().hex[:6]}"
    first = await pipe.client.submit("[[slow:300]] [[answer:one]] first", tools=[], prefetch=False, session=session)
    second = await pipe.client.submit("[[recall]] second", tools=[], prefetch=False, session=session)
    one, two = await asyncio.gather(pipe.client.wait(first, timeout=30), pipe.client.wait(second, timeout=30))
    assert (one.answer, two.answer) == ("one", "recall: one")  # the second began once the first had ended
    pool = await pipe.client.pool()
    ended = await pool.fetchval("SELECT finished_at FROM runs WHERE run_id = $1", first)
    began = await pool.fetchval("SELECT min(requested_at) FROM steps WHERE run_id = $1", second)
    assert began >= ended


async def test_deleting_a_session_erases_it_stops_its_turn_and_tombstones_it(pipe):
    session = f"chat-{uuid.uuid4().hex[:6]}"
    done = await pipe.client.submit("[[answer:kept]]", tools=[], prefetch=False, session=session)
    assert (await pipe.client.wait(done, timeout=30)).ok
    running = await pipe.client.submit("[[slow:5000]] [[answer:never]]", tools=[], prefetch=False, session=session)
    queued = await pipe.client.submit("[[answer:never either]]", tools=[], prefetch=False, session=session)

    async def both_arrived() -> bool:
        details = await pipe.client.sessions.show(session)
        return details is not None and [(t.run_id, t.status) for t in details.going] == [
            (running, "running"), (queued, "queued")]

    await wait_for(both_arrived, 10, "the second turn running and the third queued")
    assert await pipe.client.sessions.delete(session) == [running, queued]
    for run_id in (running, queued):
        result = await pipe.client.wait(run_id, timeout=10)
        assert (result.status, result.error_code) == ("failed", "session_deleted"), result
    pool = await pipe.client.pool()
    row = await pool.fetchrow("SELECT turns::text, epoch FROM sessions WHERE session_id = $1", session)
    assert json.loads(row["turns"]) == [] and row["epoch"] == 1  # erased
    assert (await _mirror(pipe, session))[-1] is None  # tombstoned
    assert await pipe.client.sessions.delete("no-such-session") is None
    again = await pipe.client.submit("[[recall]]", tools=[], prefetch=False, session=session)
    assert (await pipe.client.wait(again, timeout=30)).answer == "recall:"  # the id again: a new session
