"""The four services end to end on the real broker and database: a task in, every step an event,
an answer out (scripted model, real tool and retrieval services, real planner)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer, TopicPartition

from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.errors import TaskRejected
from agentstream.streams.core.events import DeadLetter, RunStateSnapshot, TaskSubmitted
from agentstream.streams.kafka.codec import codec_for
from agentstream.testing import Pipeline, end_offsets, isolated, read_events
from tests.integration import pipeline_tools
from tests.integration.partition_reads import read_until

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings, effects_table):
    prefix = f"t{uuid.uuid4().hex[:8]}."
    options = WorkerOptions(backend="scripted", tool_modules=TOOLS)
    async with Pipeline.start(isolated(settings, prefix), options) as pipeline:
        yield pipeline


async def test_three_step_run_is_recorded_in_order(pipe):
    run_id = await pipe.client.submit("What is 17 * 23?", tools=["calculator"], max_steps=5, prefetch=False)
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok, result
    assert "391" in (result.answer or "") and result.steps == 3

    status = await pipe.client.status(run_id)
    assert [(s["step_index"], s["kind"], s["status"]) for s in status["steps"]] == [
        (0, "model", "completed"), (1, "tool", "completed"), (2, "model", "completed")]
    assert status["steps"][1]["request"] == {"tool": "calculator", "arguments": {"expression": "17 * 23"}}

    events = await pipe.client.events(run_id)
    assert [e["event_type"] for e in events] == [
        "TaskSubmitted", "InferenceRequested", "InferenceCompleted", "ToolCallRequested", "ToolCallCompleted",
        "InferenceRequested", "InferenceCompleted", "RunCompleted"]
    assert len({e["event_id"] for e in events}) == len(events)
    for e in events[:-1]:  # every hop was consumed, and we know where from
        assert e["partition"] is not None and e["offset"] is not None and e["consumed_at"] is not None, e
        assert e["consumed_at"] >= e["produced_at"]
    assert {e["consumed_by"] for e in events[:-1]} == {"planner", "inference", "tools"}

    snapshot = await _latest_snapshot(pipe, run_id)
    assert snapshot.status == "completed" and snapshot.answer == result.answer and snapshot.step_index == 3


async def test_fifty_concurrent_runs_complete(pipe):
    tasks = [f"What is {i} + {i * 2}?" for i in range(50)]
    run_ids = await asyncio.gather(*(pipe.client.submit(t, tools=["calculator"]) for t in tasks))
    results = await asyncio.gather(*(pipe.client.wait(r, timeout=60) for r in run_ids))
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    for i, result in enumerate(results):
        assert str(i + i * 2) in (result.answer or ""), result


async def test_a_slow_tool_does_not_delay_other_runs(pipe):
    """Orders, not times: the slow run's tool is held (gated_effect) until ten runs submitted after it
    have all finished, and it is let go only then; no threshold a busy machine could miss."""
    pipeline_tools.GATE.clear()
    pipeline_tools.ENTERED.clear()
    slow = await pipe.client.submit('Wait [[tool:gated_effect {"label": "slow"}]] then [[answer:done]]',
                                    tools=["gated_effect"])
    try:
        await asyncio.wait_for(pipeline_tools.ENTERED.wait(), 30)  # its tool runs, and holds
        fast = await asyncio.gather(*(pipe.client.submit(f"What is {i} * 3?", tools=["calculator"])
                                      for i in range(10)))
        fast_results = await asyncio.gather(*(pipe.client.wait(r, timeout=30) for r in fast))
        assert all(r.ok for r in fast_results), fast_results
        # ... while the slow run still waited for its tool: the ten finished first.
        waiting = await pipe.client.status(slow)
        assert waiting["status"] == "running" and waiting["steps"][-1]["kind"] == "tool", waiting
        # agent.runs (services/planner/snapshots.py): the held run's state went out from the planner's
        # timer once the interval was up, while its tool still ran.
        held = await _snapshots(pipe, slow, until=lambda snaps: any(s.pending_kind == "tool" for s in snaps))
        assert ("running", "tool") in [(s.status, s.pending_kind) for s in held], held
    finally:
        pipeline_tools.GATE.set()
    slow_result = await pipe.client.wait(slow, timeout=30)
    assert slow_result.ok and slow_result.answer == "done", slow_result
    assert max(r.duration_ms for r in fast_results) < slow_result.duration_ms
    held = [(s.status, s.pending_kind) for s in await _snapshots(pipe, slow)]
    assert ("running", "tool") in held and held[-1] == ("completed", None), held
    # A run that ended within the snapshot interval publishes only its final state (the interval starts
    # after its submission, so a duration under it is a run the timer never reached): every fast run,
    # on an ordinary day; on a busy one, those that were quick enough.
    interval_ms = pipe.settings.snapshot_interval_ms
    for result, run_id in zip(fast_results, fast, strict=True):
        states = [s.status for s in await _snapshots(pipe, run_id)]
        assert states[-1] == "completed", (run_id, states)
        if result.duration_ms < interval_ms:
            assert states == ["completed"], (run_id, result.duration_ms, states)


async def test_deadline_and_max_steps_are_enforced(pipe):
    late = await pipe.client.submit("[[slow:3000]] What is 1 + 1?", tools=["calculator"], deadline=1.0)
    t0 = time.monotonic()
    result = await pipe.client.wait(late, timeout=30)
    assert result.status == "failed" and result.error_code == "deadline_exceeded", result
    assert time.monotonic() - t0 < 2.5

    loop = ' '.join(['[[tool:calculator {"expression": "1 + 1"}]]'] * 5)
    capped = await pipe.client.submit(loop, tools=["calculator"], max_steps=3)
    result = await pipe.client.wait(capped, timeout=30)
    assert result.status == "failed" and result.error_code == "max_steps" and result.steps == 3, result


async def test_unparseable_and_disallowed_replies_are_handled(pipe):
    once = await pipe.client.submit("[[garbage]] [[answer:fine after all]]", tools=[])
    result = await pipe.client.wait(once, timeout=30)
    assert result.ok and result.answer == "fine after all"

    always = await pipe.client.submit("[[garbage]] [[garbage]] [[garbage]] [[answer:never]]", tools=[])
    result = await pipe.client.wait(always, timeout=30)
    assert result.status == "failed" and result.error_code == "unparseable_model_output", result

    sneaky = await pipe.client.submit('[[tool:effect {"label": "forbidden"}]] [[answer:ok]]', tools=["calculator"])
    result = await pipe.client.wait(sneaky, timeout=30)
    assert result.ok
    conn_rows = await (await pipe.client.pool()).fetchval(
        "SELECT count(*) FROM test_effects WHERE run_id = $1", sneaky)
    assert conn_rows == 0  # the tool outside the allowlist never ran
    status = await pipe.client.status(sneaky)
    assert [s["kind"] for s in status["steps"] if s["kind"] != "prefetch"] == ["model", "model"]


async def test_poison_messages_go_to_the_dlq_and_processing_continues(pipe):
    topics = pipe.worker.runtime.topics
    codec = codec_for(pipe.settings)
    valid_but_invalid = codec.encode(TaskSubmitted.build(run_id="", step="x", service="test", task="t", max_steps=1))
    truncated = codec.encode(TaskSubmitted.build(run_id="r", step="r:task", service="test", task="t" * 50,
                                                 max_steps=1))[:12]  # a known schema id, cut-off Avro
    poison = [
        (topics.tasks, b"not avro at all"),
        (topics.tasks, b"\x00\x7f\xff\xff\xfe" + b"\x02ab"),  # an id no registry knows
        (topics.tasks, valid_but_invalid),  # decodes, but has no run id
        (topics.inference_requests, truncated),
    ]
    dlq_tp = TopicPartition(topics.dlq, 0)
    start = (await end_offsets(pipe.settings, [dlq_tp]))[dlq_tp]
    producer = AIOKafkaProducer(bootstrap_servers=pipe.settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for topic, value in poison:
            await producer.send_and_wait(topic, value, key=b"poison")
    finally:
        await producer.stop()

    run_id = await pipe.client.submit("What is 6 * 7?", tools=["calculator"])
    assert (await pipe.client.wait(run_id, timeout=30)).ok  # the services kept going

    letters = await read_events(pipe.settings, dlq_tp, start, expect=len(poison))
    assert all(isinstance(letter, DeadLetter) for letter in letters)
    kinds = sorted((letter.consumer, letter.error_kind) for letter in letters)
    assert kinds == sorted([("planner", "undecodable"), ("planner", "unknown_schema"),
                            ("planner", "invalid"), ("inference", "undecodable")])
    for letter in letters:
        assert letter.reason and letter.value and letter.source_topic in (topics.tasks, topics.inference_requests)


async def test_bad_tasks_are_refused_before_publishing(pipe):
    tasks_tps = [TopicPartition(pipe.worker.runtime.topics.tasks, p) for p in range(pipe.settings.partitions)]
    before = await end_offsets(pipe.settings, tasks_tps)
    bad = [
        dict(task=""), dict(task="   "), dict(task="x" * 40_000), dict(task=42),
        dict(task="ok", tools=["no_such_tool"]), dict(task="ok", tools="calculator"),
        dict(task="ok", max_steps="3"), dict(task="ok", max_steps=True), dict(task="ok", max_steps=0),
        dict(task="ok", deadline=-5), dict(task="ok", metadata={"a": 1}),
        dict(task="ok", output_schema={"type": "objekt"}), dict(task="ok", output_schema="{not json"),
        dict(task="ok", max_tokens=0), dict(task="ok", temperature=5), dict(task="ok", stop="END"),
    ]
    for kwargs in bad:
        task = kwargs.pop("task")
        with pytest.raises(TaskRejected) as info:
            await pipe.client.submit(task, **kwargs)
        assert str(info.value)
    assert "no_such_tool" in str(await _rejection(pipe, "ok", tools=["no_such_tool"]))
    assert "not valid JSON Schema" in str(await _rejection(pipe, "ok", output_schema={"type": "objekt"}))
    assert await end_offsets(pipe.settings, tasks_tps) == before  # nothing was published


CITY = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}}}


async def test_a_structured_answer_comes_back_parsed_and_an_invalid_one_fails_after_the_retries(pipe):
    good = await pipe.client.submit('[[answer:{"city": "Paris", "population": 2100000}]]', tools=[],
                                    prefetch=False, output_schema=CITY, max_tokens=64, temperature=0.2, seed=7)
    bad = await pipe.client.submit('[[answer:{"city": "Paris"}]] [[answer:Paris]] '
                                   '[[answer:{"city": "Paris", "population": "many"}]] [[answer:never]]',
                                   tools=[], prefetch=False, output_schema=CITY)
    ok, failed = await asyncio.gather(pipe.client.wait(good, timeout=30), pipe.client.wait(bad, timeout=30))
    assert ok.ok and ok.output == {"city": "Paris", "population": 2100000}, ok
    assert ok.answer == '{"city":"Paris","population":2100000}'
    [request] = [e["payload"] for e in await pipe.client.events(good) if e["event_type"] == "InferenceRequested"]
    assert (request["max_tokens"], request["temperature"], request["seed"]) == (64, 0.2, 7)  # the task's own
    assert json.loads(request["response_schema"])["anyOf"][-1]["properties"]["answer"] == CITY  # guided
    assert (failed.status, failed.error_code, failed.steps) == ("failed", "invalid_output", 3), failed
    assert "'many' is not of type 'integer'" in (failed.error or "") and failed.output is None
    asked = [e["payload"] for e in await pipe.client.events(bad) if e["event_type"] == "InferenceRequested"]
    assert len(asked) == 3  # each invalid answer went back to the model with the reason, until the last
    assert "'population' is a required property" in asked[1]["last_message"]["content"]


async def _rejection(pipe, task, **kwargs) -> TaskRejected:
    try:
        await pipe.client.submit(task, **kwargs)
    except TaskRejected as exc:
        return exc
    raise AssertionError("not rejected")


async def _latest_snapshot(pipe, run_id: str) -> RunStateSnapshot:
    return (await _snapshots(pipe, run_id))[-1]


def _ended(snapshots: list[RunStateSnapshot]) -> bool:
    return any(s.status in ("completed", "failed") for s in snapshots)


async def _snapshots(pipe, run_id: str, until=_ended) -> list[RunStateSnapshot]:
    """The run's snapshots on agent.runs, in order, read until ``until`` holds of them (by default: its
    final state is there; the planner may publish it just after the outcome), rather than for a fixed
    time; never none, never going back in version."""
    topics = pipe.worker.runtime.topics
    tp = TopicPartition(topics.runs, topics.partition_for(run_id))

    def mine(events) -> list[RunStateSnapshot]:
        return [s for s in events if s.run_id == run_id]

    snapshots = mine(await read_until(pipe.settings, [tp], lambda events: until(mine(events))))
    assert snapshots, "no snapshot on agent.runs"
    versions = [s.version for s in snapshots]
    assert versions == sorted(versions)
    return snapshots
