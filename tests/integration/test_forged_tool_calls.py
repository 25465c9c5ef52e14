"""Tool requests published straight to ``agent.tool.requests`` (a raw producer, as anyone who can reach the
broker could) are checked against their run's record before anything runs (streams/store/tool_calls.py): a call
for a run that does not exist, a tool outside the run's tools, a call waiting for an approval nobody gave,
a call for a run that has ended, a step id already used by another call. None runs its tool, none gets a
result the planner could apply, each leaves a dead letter with the reason — and the run the forgeries
named still runs its real call, once, when it is approved.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.events import DeadLetter, ToolCallCompleted, ToolCallRequested
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.kafka.codec import codec_for
from agentstream.testing import Pipeline, end_offsets, isolated, read_events, wait_awaiting_approval
from tests.integration import pipeline_tools

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings, effects_table):
    async with Pipeline.start(isolated(settings, f"t{uuid.uuid4().hex[:8]}."),
                              WorkerOptions(backend="scripted", tool_modules=TOOLS)) as pipeline:
        yield pipeline


def _forged(run_id: str, step: str, tool: str, arguments: dict) -> ToolCallRequested:
    """What an attacker would publish. Its event id is derived from the step, so for a real step it is
    the id of the planner's own request."""
    return ToolCallRequested.build(run_id=run_id, step=step, service="attacker", tool=tool,
                                   arguments=json.dumps(arguments, sort_keys=True))


async def _publish(pipe, event: ToolCallRequested) -> tuple[int, int]:
    """Publish ``event`` with a producer of its own, keyed by its run as the planner would; return where
    it landed (partition, offset)."""
    topics = pipe.worker.runtime.topics
    producer = AIOKafkaProducer(bootstrap_servers=pipe.settings.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(topics.tool_requests, codec_for(pipe.settings).encode(event),
                                            key=event.run_id.encode(), partition=topics.partition_for(event.run_id))
    finally:
        await producer.stop()
    return meta.partition, meta.offset


async def _letter(pipe, source: tuple[int, int], timeout: float = 20) -> DeadLetter:
    """The dead letter of the tool request at ``source`` (partition, offset)."""
    topics = pipe.worker.runtime.topics
    dlq = TopicPartition(topics.dlq, 0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        end = (await end_offsets(pipe.settings, [dlq]))[dlq]
        for letter in await read_events(pipe.settings, dlq, 0, expect=end, timeout=5) if end else []:
            if (isinstance(letter, DeadLetter) and letter.source_topic == topics.tool_requests
                    and (letter.source_partition, letter.source_offset) == source):
                return letter
        await asyncio.sleep(0.2)
    raise AssertionError(f"no dead letter for the tool request at {source}")


async def _results(pipe, run_id: str) -> list[ToolCallCompleted]:
    """Every ToolCallCompleted published for ``run_id`` so far."""
    topics = pipe.worker.runtime.topics
    tp = TopicPartition(topics.tool_results, topics.partition_for(run_id))
    end = (await end_offsets(pipe.settings, [tp]))[tp]
    events = await read_events(pipe.settings, tp, 0, expect=end, timeout=5) if end else []
    return [e for e in events if isinstance(e, ToolCallCompleted) and e.run_id == run_id]


async def _refused(pipe, event: ToolCallRequested, refusal: str) -> DeadLetter:
    """Publish ``event``; check it was dead-lettered as ``refusal`` and carries the request."""
    letter = await _letter(pipe, await _publish(pipe, event))
    assert (letter.error_kind, letter.consumer, letter.run_id) == ("refused", "tools", event.run_id), letter
    assert letter.reason.startswith(f"{refusal}: "), letter.reason
    original = codec_for(pipe.settings).decode(letter.value or b"")
    assert isinstance(original, ToolCallRequested) and original.event_id == event.event_id
    return letter


async def _effects(pipe, run_id: str) -> list[str]:
    pool = await pipe.client.pool()
    return [r["label"] for r in await pool.fetch("SELECT label FROM test_effects WHERE run_id = $1 ORDER BY id",
                                                 run_id)]


async def test_a_call_for_a_run_that_does_not_exist_is_refused_and_real_runs_go_on(pipe):
    ghost = new_run_id()
    forged = _forged(ghost, f"{ghost}:1:tool", "effect", {"label": "forged"})
    letter = await _refused(pipe, forged, "unknown_run")
    assert f"run {ghost!r} does not exist" in letter.reason
    assert await _effects(pipe, ghost) == []
    assert await _results(pipe, ghost) == []
    pool = await pipe.client.pool()
    assert await pool.fetchval("SELECT count(*) FROM tool_calls WHERE run_id = $1", ghost) == 0

    run_id = await pipe.client.submit('[[tool:effect {"label": "real"}]] [[answer:done]]', tools=["effect"],
                                      prefetch=False)
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.answer == "done", result
    assert await _effects(pipe, run_id) == ["real"]


async def test_calls_the_run_did_not_ask_for_are_refused_and_its_real_call_runs_once(pipe):
    run_id = await pipe.client.submit('[[tool:transfer {"amount": 5}]] [[answer:sent]]', tools=["transfer"],
                                      prefetch=False)
    waiting = await wait_awaiting_approval(pipe.client, run_id, 15)
    step = waiting["step_id"]
    pool = await pipe.client.pool()
    version = await pool.fetchval("SELECT version FROM runs WHERE run_id = $1", run_id)

    # (a) a tool outside the run's tools, at the run's own pending step
    letter = await _refused(pipe, _forged(run_id, step, "effect", {"label": "sneaked"}), "tool_not_allowed")
    assert "'effect' is not among the tools of run" in letter.reason
    # (c) the very call that waits for approval, before anyone approved it — with the event id the
    # planner's request will have: refusing it must not make the real request a duplicate
    premature = _forged(run_id, step, "transfer", {"amount": 5})
    await _refused(pipe, premature, "awaiting_approval")
    assert await _effects(pipe, run_id) == []
    assert await _results(pipe, run_id) == []  # nothing the planner could take for the step's answer
    assert await pool.fetchval("SELECT version FROM runs WHERE run_id = $1", run_id) == version
    assert [w["step_id"] for w in await pipe.client.awaiting_approval() if w["run_id"] == run_id] == [step]

    await pipe.client.approve(run_id, step, by="ana")
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.answer == "sent", result
    assert await _effects(pipe, run_id) == ["transfer 5"]
    [real] = await _results(pipe, run_id)
    assert real.ok and real.step_id == step and not real.replayed, real

    # After the fact: the step's id with other arguments (and an event id of its own: a copy of the real
    # request's id is dropped as a duplicate before any check) does not get the real call's answer, and
    # a new step of the ended run is not run.
    other = dataclasses.replace(_forged(run_id, step, "transfer", {"amount": 5000}), event_id=str(uuid.uuid4()))
    await _refused(pipe, other, "step_taken")
    letter = await _refused(pipe, _forged(run_id, f"{run_id}:7:tool", "transfer", {"amount": 1}), "run_finished")
    assert "has ended (completed)" in letter.reason
    assert await _effects(pipe, run_id) == ["transfer 5"]
    assert len(await _results(pipe, run_id)) == 1


async def _handled(pipe, source: tuple[int, int], timeout: float = 20) -> None:
    """Wait until the tool service committed past the request at ``source``: it finished with it (the
    runtime commits an offset only after the record's outputs, a letter included, were acknowledged)."""
    topics = pipe.worker.runtime.topics
    tp = TopicPartition(topics.tool_requests, source[0])
    consumer = AIOKafkaConsumer(**pipe.settings.kafka_options(), group_id=topics.group("tools"),
                                enable_auto_commit=False)
    await consumer.start()
    try:
        deadline = time.monotonic() + timeout
        while (await consumer.committed(tp) or 0) <= source[1]:
            assert time.monotonic() < deadline, f"the tool service did not get past the request at {source}"
            await asyncio.sleep(0.1)
    finally:
        await consumer.stop()


async def test_a_late_copy_of_an_idempotent_tools_call_is_dropped_and_a_changed_one_refused(pipe):
    """The calculator is idempotent: its calls are checked but leave no ``tool_calls`` row. A copy of its
    call that arrives after the run has ended — as a new owner of the partition would receive it, past
    the runtime's memory of finished event ids — is recognised from the step the planner recorded and
    dropped: no dead letter, no second answer. The same step id with other arguments is still refused."""
    run_id = await pipe.client.submit('[[tool:calculator {"expression": "6 * 7"}]] [[answer:done]]',
                                      tools=["calculator"], prefetch=False)
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.answer == "done", result
    [real] = await _results(pipe, run_id)
    assert real.ok and real.result == "42" and not real.replayed, real
    pool = await pipe.client.pool()
    assert await pool.fetchval("SELECT count(*) FROM tool_calls WHERE run_id = $1", run_id) == 0

    copy = dataclasses.replace(_forged(run_id, real.step_id, "calculator", {"expression": "6 * 7"}),
                               event_id=str(uuid.uuid4()))
    where = await _publish(pipe, copy)
    changed = dataclasses.replace(_forged(run_id, real.step_id, "calculator", {"expression": "6 * 8"}),
                                  event_id=str(uuid.uuid4()))
    letter = await _refused(pipe, changed, "run_finished")
    await _handled(pipe, where)
    topics = pipe.worker.runtime.topics
    dlq = TopicPartition(topics.dlq, 0)
    end = (await end_offsets(pipe.settings, [dlq]))[dlq]
    letters = [m for m in await read_events(pipe.settings, dlq, 0, expect=end, timeout=5)
               if isinstance(m, DeadLetter) and m.run_id == run_id]
    assert [(m.source_partition, m.source_offset) for m in letters] == [(letter.source_partition,
                                                                         letter.source_offset)]
    assert len(await _results(pipe, run_id)) == 1


# -- parallel calls (services/planner/fanout.py): the claim accepts each call of the pending set, once ------

async def _requests(pipe, run_id: str) -> list[ToolCallRequested]:
    """Every ToolCallRequested of ``run_id`` on the topic: the calls of a fan-out are keyed by their own
    step id, so they are spread over the partitions."""
    topics = pipe.worker.runtime.topics
    tps = [TopicPartition(topics.tool_requests, p) for p in range(topics.partitions)]
    ends = await end_offsets(pipe.settings, tps)
    found: list[ToolCallRequested] = []
    for tp in tps:
        if ends[tp]:
            found += [e for e in await read_events(pipe.settings, tp, 0, expect=ends[tp], timeout=5)
                      if isinstance(e, ToolCallRequested) and e.run_id == run_id]
    return found


async def test_a_reply_with_three_calls_runs_each_once_side_by_side_and_the_model_gets_every_result(pipe):
    run_id = await pipe.client.submit('[[tools:effect {"label": "p1"} | sleep {"seconds": 0.3} | '
                                      'effect {"label": "p3"}]]', tools=["effect", "sleep"], prefetch=False)
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.steps == 5, result
    # The model's next reply saw every result, in the order it asked for them.
    assert result.answer == ('Based on the last step: effect returned: "recorded p1" | '
                             'sleep returned: "slept 0.3 s" | effect returned: "recorded p3"'), result
    assert sorted(await _effects(pipe, run_id)) == ["p1", "p3"]
    steps = (await pipe.client.status(run_id))["steps"]
    assert [(s["step_index"], s["kind"], s["status"]) for s in steps] == [
        (0, "model", "completed"), (1, "tool", "completed"), (2, "tool", "completed"), (3, "tool", "completed"),
        (4, "model", "completed")]
    calls = steps[1:4]
    assert [s["request"]["parallel"] for s in calls] == [{"call": k, "calls": 3} for k in range(3)]
    assert len({s["requested_at"] for s in calls}) == 1  # one transition fanned them out
    assert calls[0]["completed_at"] < calls[1]["completed_at"]  # p1 did not wait for the sleep before it
    assert [r.step_id for r in sorted(await _results(pipe, run_id), key=lambda r: r.step_id)] == [
        f"{run_id}:{i}:tool" for i in (1, 2, 3)]


async def test_a_redelivered_fan_out_runs_no_call_twice(pipe):
    pipeline_tools.GATE.clear()
    pipeline_tools.ENTERED.clear()
    try:
        run_id = await pipe.client.submit('[[tools:gated_effect {"label": "g1"} | gated_effect {"label": "g2"}]]',
                                          tools=["gated_effect"], prefetch=False)
        await asyncio.wait_for(pipeline_tools.ENTERED.wait(), 30)
        requests = await _requests(pipe, run_id)
        assert sorted(r.step_id for r in requests) == [f"{run_id}:1:tool", f"{run_id}:2:tool"]
        # The same requests again, as a planner republishing the fan-out sends them, while the calls run.
        producer = AIOKafkaProducer(bootstrap_servers=pipe.settings.kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for request in requests * 2:
                await producer.send_and_wait(pipe.worker.runtime.topics.tool_requests,
                                             codec_for(pipe.settings).encode(request), key=request.step_id.encode())
        finally:
            await producer.stop()
        await asyncio.sleep(0.5)
    finally:
        pipeline_tools.GATE.set()
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and "recorded g1" in (result.answer or "") and "recorded g2" in (result.answer or ""), result
    assert sorted(await _effects(pipe, run_id)) == ["g1", "g2"]
    pool = await pipe.client.pool()
    rows = await pool.fetch("SELECT step_id, status, attempts FROM tool_calls WHERE run_id = $1 ORDER BY step_id",
                            run_id)
    assert [tuple(r) for r in rows] == [(f"{run_id}:1:tool", "succeeded", 1), (f"{run_id}:2:tool", "succeeded", 1)]


async def test_a_call_that_needs_approval_holds_only_itself(pipe):
    run_id = await pipe.client.submit('[[tools:transfer {"amount": 7} | effect {"label": "free"}]]',
                                      tools=["transfer", "effect"], prefetch=False)
    waiting = await wait_awaiting_approval(pipe.client, run_id, 15)
    step = f"{run_id}:1:tool"
    assert (waiting["step_id"], waiting["tool"], waiting["arguments"]) == (step, "transfer", {"amount": 7})
    pool = await pipe.client.pool()
    deadline = time.monotonic() + 15
    # The other call ran meanwhile; its result is in, and only the call waiting for a person holds the fan-in.
    while (await pool.fetchval("SELECT status FROM runs WHERE run_id = $1", run_id) != "awaiting_approval"
           or await _effects(pipe, run_id) != ["free"]):
        assert time.monotonic() < deadline, await _effects(pipe, run_id)
        await asyncio.sleep(0.1)
    await _refused(pipe, _forged(run_id, step, "transfer", {"amount": 7}), "awaiting_approval")
    # An approver's record (AGENTSTREAM_APPROVALS=recorded) is accepted for the waiting call of the fan-out
    # (migration 0017), and refused for its other call, which waits for no one.
    with pytest.raises(asyncpg.PostgresError) as refused:
        await pool.fetchrow("SELECT * FROM agentstream_decide($1, $2, true, '')", run_id, f"{run_id}:2:tool")
    assert refused.value.sqlstate == "ZA001"
    recorded = await pool.fetchrow("SELECT * FROM agentstream_decide($1, $2, true, 'fine')", run_id, step)
    assert recorded["approved"] and recorded["decided_now"]

    await pipe.client.approve(run_id, step, by="ana")
    result = await pipe.client.wait(run_id, timeout=30)
    assert result.ok and result.answer is not None, result
    assert result.answer.index("transfer returned") < result.answer.index("effect returned"), result.answer
    assert sorted(await _effects(pipe, run_id)) == ["free", "transfer 7"]
