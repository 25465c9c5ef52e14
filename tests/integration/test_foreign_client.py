"""A task published the way a Java, Go or Node team would publish it (tests/integration/foreign_client.py:
no agentstream code, librdkafka's CRC32 partitioner, no headers, an event id that is not a UUID) runs to
completion with two planners, and its outcome is read with plain aiokafka and fastavro. The batches are
snappy-compressed, as franz-go's are by default.

Each task is put on another partition than murmur2's, so the planner that owns that partition must
forward it to the run's partition (streams/runtime/runner.py, ``route_by_run``); the test checks the forwarded
copies on the topic, so it cannot pass without that path. The tasks' partitions are chosen so that both
planners (this process's and a separate worker process) forward some.
"""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.services.worker import WorkerOptions
from agentstream.streams.replay.timeline import show
from agentstream.streams.runtime.headers import ROUTED_HEADER
from agentstream.testing import Pipeline, isolated
from tests.integration import foreign_client
from tests.integration.processes import start_worker, stop, wait_for_members

pytestmark = pytest.mark.slow
RUNS = 8


async def _records(bootstrap: str, topic: str, partitions: int) -> list[tuple[int, int, bytes | None, dict[str, bytes]]]:
    """(partition, offset, key, headers) of every record of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        out = []
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for messages in (await consumer.getmany(timeout_ms=300)).values():
                out.extend((m.partition, m.offset, m.key, dict(m.headers or ())) for m in messages)
        return out
    finally:
        await consumer.stop()


def _run_ids(partition_for, partitions: int, mine: set[int]) -> list[str]:
    """Run ids whose CRC32 partition is not their murmur2 one, half of them on partitions this process's
    planner owns and half on the other planner's."""
    want_mine, want_theirs, out = RUNS // 2, RUNS - RUNS // 2, []
    while want_mine or want_theirs:
        run_id = f"ext-{uuid.uuid4().hex[:16]}"
        landed = foreign_client.crc32_partition(run_id.encode(), partitions)
        if landed == partition_for(run_id):
            continue
        if landed in mine and want_mine:
            want_mine -= 1
        elif landed not in mine and want_theirs:
            want_theirs -= 1
        else:
            continue
        out.append(run_id)
    return out


async def test_a_foreign_client_publishes_a_task_and_reads_its_outcome(settings, tmp_path):
    s = isolated(settings, f"t{uuid.uuid4().hex[:8]}.", partitions=8)
    options = WorkerOptions(backend="scripted", tool_modules=("agentstream.services.tools.builtin",))
    async with Pipeline.start(s, options) as pipe:
        topics = pipe.worker.runtime.topics
        proc = start_worker(s, "planner", tmp_path / "planner.log")
        try:
            await wait_for_members(s.kafka_bootstrap, topics.group("planner"), 2)
            (planner,) = [r for r in pipe.worker.runners if r.config.name == "planner"]
            assert planner.consumer is not None
            mine = {tp.partition for tp in planner.consumer.assignment() if tp.topic == topics.tasks}
            assert 0 < len(mine) < s.partitions, mine  # two planners share the partitions

            run_ids = _run_ids(topics.partition_for, s.partitions, mine)
            tasks = [foreign_client.task_submitted(r, f"What is {i + 6} * 7?", ["calculator"])
                     for i, r in enumerate(run_ids)]
            sent = await foreign_client.publish_tasks(s.kafka_bootstrap, topics.tasks, tasks)
            for run_id, meta in zip(run_ids, sent, strict=True):
                assert meta.partition == foreign_client.crc32_partition(run_id.encode(), s.partitions)
                assert meta.partition != topics.partition_for(run_id)

            outcomes = await foreign_client.read_outcomes(s.kafka_bootstrap, topics.outcomes, run_ids, timeout=90)
        finally:
            stop(proc)
        assert set(outcomes) == set(run_ids), f"no outcome for {set(run_ids) - set(outcomes)}"
        for i, run_id in enumerate(run_ids):
            record, datum = outcomes[run_id]
            assert record == "RunCompleted", datum
            assert str((i + 6) * 7) in datum["answer"], datum

        # Every task was forwarded once to its run's partition: the original (no headers) where the CRC32
        # partitioner put it, the copy (same key and value) on murmur2's partition, naming the original.
        records = await _records(s.kafka_bootstrap, topics.tasks, s.partitions)
        for run_id, meta in zip(run_ids, sent, strict=True):
            of_run = [r for r in records if r[2] == run_id.encode()]
            assert (meta.partition, meta.offset, run_id.encode(), {}) in of_run
            copies = [r for r in of_run if r[0] == topics.partition_for(run_id)]
            assert copies and all(h[ROUTED_HEADER] == f"{topics.tasks}:{meta.partition}:{meta.offset}".encode()
                                  for _p, _o, _k, h in copies), of_run
        # This process's planner forwarded the tasks that landed on its partitions (the other planner,
        # the rest: their copies are checked above).
        assert planner.stats["routed"] >= RUNS // 2
        # The history keeps the run's task as it was sent (its event id is not a UUID: stored as a UUIDv5),
        # and `agentstream replay show` finds it on the topic where the history says it is.
        events = await pipe.client.events(run_ids[0])
        (task,) = [e for e in events if e["event_type"] == "TaskSubmitted"]
        assert task["partition"] == topics.partition_for(run_ids[0])
        assert task["payload"]["metadata"] == {"origin": "foreign"}
        timeline = await show(s, run_ids[0])
        assert timeline is not None
        (checked,) = [e for e in timeline.events if e.event_type == "TaskSubmitted"]
        assert checked.kafka == "verified", checked.kafka_note
