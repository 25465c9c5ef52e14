"""Issue 36, "Bad input", on the secure stack with two tenants (the flood is ``test_tenant_flood.py``; a tenant
writing another tenant's prefix is ``test_tenants.py``; forged event types on a topic, ``test_forged_results.py``):

- **forged headers**: a tenant's task carrying every header the runtime writes, forged (``agentstream-type``
  naming another event, ``agentstream-routed-from``, ``agentstream-source``, ``agentstream-redrive``, a
  session it is not a turn of, a 100,000-character ``traceparent``), on a partition other than its run's:
  the run completes with its own answer and no planner log line carries the junk, nor the run's row or its
  task's event row (they kept it until this test found it);
- **oversized records**: a record over the broker's limit is refused to the producer by the broker itself; a
  task under it but over the planner's (32 KiB of text) fails its run with ``invalid_task`` and why, on the
  tenant's own outcomes;
- **replays of captured records**: a finished run's own records, byte for byte, sent again by the principals
  that may write them (the tenant its task, on its partition and on another; the ``tools`` principal its
  result; the planner principal its tool request): once the planner and the tool service have consumed them
  all, the run, its steps and its one side effect are as they were.
"""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import MessageSizeTooLargeError

from agentstream.ops.acls import tenant_prefix, tenant_principal
from agentstream.streams.config.kafka_auth import kafka_options
from agentstream.streams.core.events import RunFailed, TaskSubmitted
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.core.task_rules import MAX_TASK_BYTES
from agentstream.streams.kafka.codec import codec_for
from agentstream.testing import end_offsets, read_events
from tests.integration.acl_probes import connection, send
from tests.integration.hostile.conftest import ACME, PARTITIONS, PLANNERS, Cells
from tests.integration.processes import wait_for

pytestmark = pytest.mark.asyncio(loop_scope="package")
JUNK_TRACE = "00-" + "7" * 100_000


def _task(run_id: str, text: str, tools: list[str]) -> TaskSubmitted:
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", task=text, tools=tools,
                               max_steps=4, prefetch=False)


def _other_partition(run_id: str, topics) -> int:
    return (topics.partition_for(run_id) + 1) % PARTITIONS


async def test_forged_headers_on_a_task_change_nothing_it_does(cells: Cells):
    await _forged_run(cells)
    assert "7" * 1000 not in cells.log_text(*PLANNERS)


async def test_a_junk_traceparent_is_not_kept_on_the_run(cells: Cells):
    """Found by this suite: the header was kept as it came (100,000 characters on the run's and its
    TaskSubmitted's rows); now one that is not a W3C traceparent is dropped (streams/telemetry/trace_context.valid)."""
    run_id = await _forged_run(cells)
    async with connection(cells.stack.database_url) as conn:
        kept = await conn.fetch("SELECT traceparent FROM runs WHERE run_id = $1 UNION ALL "
                                "SELECT traceparent FROM events WHERE run_id = $1", run_id)
    assert all(len(r["traceparent"] or "") <= 55 for r in kept)


async def _forged_run(cells: Cells) -> str:
    """A task of acme's with every header forged, on another partition than its run's; it completes with
    its own answer. Its run id."""
    topics = cells.topics(ACME)
    run_id = new_run_id()
    async with cells.client(ACME) as client:
        await client.watch_outcomes()
        value = codec_for(client.settings).encode(_task(run_id, "[[answer:own answer]]", []))
        forged = [("agentstream-type", b"InferenceCompleted"), ("agentstream-routed-from", b"beta.agent.tasks:0:0"),
                  ("agentstream-source", f"{topics.tool_requests}:0:0:0:0".encode()),
                  ("agentstream-redrive", b"beta.agent.dlq[0]@0"), ("agentstream-session", b"someone-elses-session"),
                  ("traceparent", JUNK_TRACE.encode())]
        out = AIOKafkaProducer(**kafka_options(cells.stack.bootstrap, cells.stack.auth(tenant_principal(ACME))),
                               acks="all")
        await out.start()
        try:
            await out.send_and_wait(topics.tasks, value, key=run_id.encode(), headers=forged,
                                    partition=_other_partition(run_id, topics))
        finally:
            await out.stop()
        result = await client.wait(run_id, timeout=60)
    assert (result.status, result.answer) == ("completed", "own answer"), result
    return run_id


async def test_oversized_records_are_refused_with_a_reason(cells: Cells):
    topics = cells.topics(ACME)
    big = AIOKafkaProducer(**kafka_options(cells.stack.bootstrap, cells.stack.auth(tenant_principal(ACME))),
                           acks="all", max_request_size=8 * 1024 * 1024)  # past the client's own check: the broker's
    await big.start()
    try:
        with pytest.raises(MessageSizeTooLargeError):
            await big.send_and_wait(topics.tasks, b"\x00" * (2 * 1024 * 1024), key=b"too-big", partition=0)
    finally:
        await big.stop()

    run_id = new_run_id()
    settings = cells.stack.settings(topic_prefix=tenant_prefix(ACME), principal=tenant_principal(ACME))
    outcomes = TopicPartition(topics.outcomes, topics.partition_for(run_id))
    start = (await end_offsets(settings, [outcomes]))[outcomes]
    value = codec_for(settings).encode(_task(run_id, "x" * (MAX_TASK_BYTES + 1), []))
    await send(cells.stack, tenant_principal(ACME), topics.tasks, value, run_id, topics.partition_for(run_id))

    async def told() -> bool:  # on the tenant's own outcomes, read with its own principal
        events = await read_events(settings, outcomes, start, expect=10**6, timeout=0.5)
        failed.extend(e for e in events if isinstance(e, RunFailed) and e.run_id == run_id)
        return bool(failed)

    failed: list[RunFailed] = []
    await wait_for(told, 60, f"RunFailed for {run_id}")
    assert failed[0].error_code == "invalid_task" and str(MAX_TASK_BYTES) in failed[0].error, failed[0]


async def test_replayed_captured_records_change_nothing(cells: Cells):
    topics = cells.topics(ACME)
    run_id = new_run_id()
    async with cells.client(ACME) as client:  # published as any producer would (no catalogue lookup first)
        await client.watch_outcomes()
        value = codec_for(client.settings).encode(_task(run_id, '[[tool:effect {"label": "once"}]] [[answer:done]]',
                                                        ["effect"]))
        await send(cells.stack, tenant_principal(ACME), topics.tasks, value, run_id, topics.partition_for(run_id))
        assert (await client.wait(run_id, timeout=60)).status == "completed"
    async with connection(cells.stack.database_url) as conn:
        where = {r["event_type"]: (r["topic"], r["partition"], r["offset"]) for r in await conn.fetch(
            """SELECT event_type, topic, partition, "offset" FROM events WHERE run_id = $1 AND event_type IN
               ('TaskSubmitted', 'ToolCallRequested', 'ToolCallCompleted')""", run_id)}
        before = await _run_state(conn, run_id)
    assert set(where) == {"TaskSubmitted", "ToolCallRequested", "ToolCallCompleted"}, where
    captured = {kind: await _record(cells, *at) for kind, at in where.items()}

    sent = [await _resend(cells, tenant_principal(ACME), topics.tasks, captured["TaskSubmitted"], None),
            await _resend(cells, tenant_principal(ACME), topics.tasks, captured["TaskSubmitted"],
                          _other_partition(run_id, topics)),
            await _resend(cells, "tools", topics.tool_results, captured["ToolCallCompleted"], None)]
    request = await _resend(cells, "planner", topics.tool_requests, captured["ToolCallRequested"], None)

    await _consumed(cells, topics.group("tools"), topics.tool_requests, request)
    for topic, at in [(topics.tasks, sent[0]), (topics.tasks, sent[1]), (topics.tool_results, sent[2])]:
        await _consumed(cells, topics.group("planner"), topic, at)
    home = TopicPartition(topics.tasks, topics.partition_for(run_id))  # where the misrouted copy was forwarded
    end = (await end_offsets(cells.stack.settings(), [home]))[home]
    await _consumed(cells, topics.group("planner"), topics.tasks, (home.partition, end - 1))
    async with connection(cells.stack.database_url) as conn:
        assert await _run_state(conn, run_id) == before
    assert await cells.effects(run_id) == ["once"]


async def _run_state(conn, run_id: str) -> tuple:
    run = await conn.fetchrow("SELECT status, answer, version, step_count FROM runs WHERE run_id = $1", run_id)
    steps = await conn.fetchval("SELECT count(*) FROM steps WHERE run_id = $1", run_id)
    return tuple(run), steps


async def _record(cells: Cells, topic: str, partition: int, offset: int) -> tuple:
    """(key, value, headers) of the record at ``topic[partition]@offset``, read as the administrator."""
    consumer = AIOKafkaConsumer(**kafka_options(cells.stack.bootstrap, cells.stack.auth()), enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        for _ in range(40):
            for msg in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                if msg.offset == offset:
                    return msg.key, msg.value, list(msg.headers)
        raise AssertionError(f"no record at {topic}[{partition}]@{offset}")
    finally:
        await consumer.stop()


async def _resend(cells: Cells, principal: str, topic: str, record: tuple, partition: int | None) -> tuple[int, int]:
    """Publish a captured record again, byte for byte, as ``principal``; where it landed."""
    key, value, headers = record
    out = AIOKafkaProducer(**kafka_options(cells.stack.bootstrap, cells.stack.auth(principal)), acks="all")
    await out.start()
    try:
        meta = await out.send_and_wait(topic, value, key=key, headers=headers, partition=partition)
    finally:
        await out.stop()
    return meta.partition, meta.offset


async def _consumed(cells: Cells, group: str, topic: str, at: tuple[int, int]) -> None:
    """Wait until ``group`` has committed past the record at ``at`` (partition, offset) of ``topic``."""
    tp = TopicPartition(topic, at[0])
    admin = AIOKafkaAdminClient(**kafka_options(cells.stack.bootstrap, cells.stack.auth()))
    await admin.start()
    try:
        async def past() -> bool:
            committed = (await admin.list_consumer_group_offsets(group)).get(tp)
            return committed is not None and committed.offset > at[1]

        await wait_for(past, 60, f"{group} past {topic}[{at[0]}]@{at[1]}")
    finally:
        await admin.close()
