"""Dead letters end to end, on the real broker and database: poison and oversized records become letters
that were really sent while the service keeps going; `list`, `show` and `redrive` through the Python
API and the CLI (agentstream/ops/dlq.py, `agentstream dlq`)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import sys
import time
import uuid

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.structs import ConsumerRecord, RecordMetadata

from agentstream.ops.dlq import REDRIVE_HEADER, DeadLetters
from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import (
    DeadLetter,
    InferenceCompleted,
    InferenceRequested,
    Message,
    TaskSubmitted,
)
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.runtime.runner import ServiceRunner
from agentstream.testing import Pipeline, isolated

pytestmark = pytest.mark.asyncio(loop_scope="module")

BIG = 2 * 1024 * 1024


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pipe(settings):
    prefix = f"t{uuid.uuid4().hex[:8]}."
    async with Pipeline.start(isolated(settings, prefix), WorkerOptions(backend="scripted"),
                              services=("inference",)) as pipeline:
        yield pipeline


def inference(pipe: Pipeline) -> ServiceRunner:
    return next(r for r in pipe.worker.runners if r.config.name == "inference")


def big_value() -> bytes:
    """About 2 MiB that gzip shrinks well below the broker's 1 MiB record limit (and not an event)."""
    lines = b"".join(b"line %08d of a record far too large for a dead letter\n" % i for i in range(40_000))
    return lines[:BIG]


async def produce(settings: Settings, topic: str, value: bytes, *, key: bytes = b"poison",
                  gzip: bool = False) -> RecordMetadata:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all",
                                compression_type="gzip" if gzip else None, max_request_size=4 * BIG)
    await producer.start()
    try:
        return await producer.send_and_wait(topic, value, key=key, partition=0,
                                            headers=[("test-origin", b"test_dlq")])
    finally:
        await producer.stop()


async def read_record(settings: Settings, topic: str, partition: int, offset: int) -> ConsumerRecord:
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        consumer.seek(tp, offset)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            for msg in (await consumer.getmany(tp, timeout_ms=300)).get(tp, []):
                if msg.offset == offset:
                    return msg
        raise AssertionError(f"no record {topic}[{partition}]@{offset}")
    finally:
        await consumer.stop()


async def letter_for(pipe: Pipeline, topic: str, offset: int, *, redrive_of: str | None = None,
                     timeout: float = 30.0) -> tuple[int, DeadLetter]:
    """The dead letter (its offset, and it) of ``topic[0]@offset``, waiting for it to be published."""
    codec = codec_for(pipe.settings)
    tp = TopicPartition(pipe.worker.runtime.topics.dlq, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=pipe.settings.kafka_bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in (await consumer.getmany(tp, timeout_ms=300)).get(tp, []):
                letter = codec.decode(msg.value)
                assert isinstance(letter, DeadLetter)
                if (letter.source_topic, letter.source_partition, letter.source_offset) == (topic, 0, offset):
                    return msg.offset, letter
    finally:
        await consumer.stop()
    raise AssertionError(f"no dead letter for {topic}[0]@{offset} within {timeout} s")


async def still_serving(pipe: Pipeline) -> None:
    """The inference service answers a good request published after the poison."""
    topics = pipe.worker.runtime.topics
    run_id = f"run-{uuid.uuid4().hex[:16]}"
    request = InferenceRequested.build(run_id=run_id, step=f"{run_id}:0:model", service="test",
                                       messages=[Message(role="user", content="[[answer:still here]]")])
    await (await pipe.worker.runtime.send(topics.inference_requests, request))
    tp = TopicPartition(topics.inference_results, topics.partition_for(run_id))
    codec = codec_for(pipe.settings)
    consumer = AIOKafkaConsumer(bootstrap_servers=pipe.settings.kafka_bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for msg in (await consumer.getmany(tp, timeout_ms=300)).get(tp, []):
                event = codec.decode(msg.value)
                if isinstance(event, InferenceCompleted) and event.run_id == run_id:
                    assert "still here" in event.text
                    assert not inference(pipe).stopping
                    return
    finally:
        await consumer.stop()
    raise AssertionError("the inference service did not answer after the poison")


async def cli(pipe: Pipeline, *args: str) -> tuple[int, str]:
    """``agentstream ARGS`` in a subprocess, pointed at this pipeline's broker, database and prefix."""
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": pipe.settings.kafka_bootstrap,
           "DATABASE_URL": pipe.settings.database_url, "AGENTSTREAM_TOPIC_PREFIX": pipe.settings.topic_prefix,
           "COLUMNS": "250"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "agentstream.cli", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode()


async def test_random_bytes_become_a_letter_and_the_service_keeps_running(pipe):
    topic = pipe.worker.runtime.topics.inference_requests
    value = random.Random(1).randbytes(3000)
    sent = await produce(pipe.settings, topic, value, key=b"random-key")
    _, letter = await letter_for(pipe, topic, sent.offset)
    assert (letter.consumer, letter.error_kind) == ("inference", "undecodable")
    assert letter.value == value and letter.key == b"random-key" and not letter.truncated
    assert letter.headers["test-origin"] == b"test_dlq"
    assert letter.value_size == len(value) and letter.value_sha256 == hashlib.sha256(value).hexdigest()
    await still_serving(pipe)


async def test_a_2mb_compressed_record_gets_a_truncated_letter_and_the_service_keeps_running(pipe):
    topic = pipe.worker.runtime.topics.inference_requests
    value = big_value()
    before = inference(pipe).stats["dead_lettered"]
    sent = await produce(pipe.settings, topic, value, gzip=True)  # accepted compressed, 2 MiB inside
    dlq_offset, letter = await letter_for(pipe, topic, sent.offset)
    record = await read_record(pipe.settings, pipe.worker.runtime.topics.dlq, 0, dlq_offset)
    assert len(record.value) <= pipe.settings.max_event_bytes  # what was sent fits
    assert letter.truncated and letter.error_kind == "undecodable"
    assert letter.value and value.startswith(letter.value) and len(letter.value) > 400 * 1024
    assert letter.value_size == len(value) and letter.value_sha256 == hashlib.sha256(value).hexdigest()
    await still_serving(pipe)
    assert inference(pipe).stats["dead_lettered"] > before


async def test_list_and_show_through_the_api_and_the_cli(pipe):
    topics = pipe.worker.runtime.topics
    task = f"a task, which the inference requests topic does not carry {uuid.uuid4().hex}"
    event = TaskSubmitted.build(run_id="run-listshow", step="run-listshow:task", service="test", task=task,
                                max_steps=2)
    sent = await produce(pipe.settings, topics.inference_requests, codec_for(pipe.settings).encode(event),
                         key=b"run-listshow")
    dlq_offset, _ = await letter_for(pipe, topics.inference_requests, sent.offset)

    async with DeadLetters(pipe.settings) as letters:
        listed = await letters.list(kind="refused", source_topic=topics.inference_requests)
        assert dlq_offset in [s.offset for s in listed]
        assert all(s.letter is not None and s.letter.error_kind == "refused" for s in listed)
        assert await letters.list(kind="no_such_kind") == []
        assert [s.offset for s in await letters.list(limit=1)][-1] >= dlq_offset  # the most recent
        details = await letters.show(dlq_offset)
    assert isinstance(details.original, TaskSubmitted) and details.original.task == task
    summary = details.stored.summary()
    assert summary["run_id"] == "run-listshow" and summary["consumer"] == "inference"
    assert summary["source_offset"] == sent.offset and "TaskSubmitted" in summary["reason"]

    code, out = await cli(pipe, "dlq", "list", "--json", "--kind", "refused")
    assert code == 0, out
    row = next(r for r in json.loads(out) if r["offset"] == dlq_offset)
    assert (row["source_topic"], row["source_partition"], row["source_offset"]) == (topics.inference_requests, 0,
                                                                                   sent.offset)
    assert row["error_kind"] == "refused" and row["run_id"] == "run-listshow" and row["redrives"] == 0
    code, out = await cli(pipe, "dlq", "list")
    assert code == 0 and "refused" in out and f"@{sent.offset}" in out, out
    code, out = await cli(pipe, "dlq", "show", str(dlq_offset), "--json")
    assert code == 0, out
    shown = json.loads(out)
    assert shown["original_type"] == "TaskSubmitted" and shown["original"]["task"] == task
    assert shown["headers"]["test-origin"] == "test_dlq" and shown["key"] == "run-listshow"
    code, out = await cli(pipe, "dlq", "show", "999999")
    assert code == 2 and "no record" in out, out


async def test_redrive_republishes_the_same_bytes_once_unless_forced(pipe):
    topics = pipe.worker.runtime.topics
    value = random.Random(2).randbytes(500)
    sent = await produce(pipe.settings, topics.inference_requests, value, key=b"redrive-me")
    dlq_offset, _ = await letter_for(pipe, topics.inference_requests, sent.offset)
    address = f"{topics.dlq}:0:{dlq_offset}"

    async with DeadLetters(pipe.settings) as letters:
        (dry,) = await letters.redrive([dlq_offset], dry_run=True)
        assert dry.action == "would_redrive"
        (first,) = await letters.redrive([dlq_offset])
        assert first.action == "redriven" and first.value_from == "letter", first
        (again,) = await letters.redrive([dlq_offset])
        assert again.action == "skipped" and "already re-driven" in again.detail
        assert (await letters.show(dlq_offset)).redrives[0]["target_offset"] == first.target_offset
    copy = await read_record(pipe.settings, topics.inference_requests, 0, first.target_offset)
    assert copy.value == value and copy.key == b"redrive-me"
    headers = dict(copy.headers)
    assert headers["test-origin"] == b"test_dlq" and headers[REDRIVE_HEADER] == address.encode()

    code, out = await cli(pipe, "dlq", "redrive", str(dlq_offset), "--json")
    assert code == 0 and json.loads(out)[0]["action"] == "skipped", out
    code, out = await cli(pipe, "dlq", "redrive", str(dlq_offset), "--force", "--json")
    assert code == 0, out
    forced = json.loads(out)[0]
    assert forced["action"] == "redriven" and forced["target_offset"] > first.target_offset
    assert (await read_record(pipe.settings, topics.inference_requests, 0, forced["target_offset"])).value == value

    # The copy is the same poison: the service dead-letters it again, and that letter says where it came from.
    _, second = await letter_for(pipe, topics.inference_requests, first.target_offset)
    assert second.value == value and second.headers[REDRIVE_HEADER] == address.encode()
    code, out = await cli(pipe, "dlq", "list", "--json", "--source-topic", topics.inference_requests)
    assert next(r for r in json.loads(out) if r["offset"] == dlq_offset)["redrives"] == 2


async def test_redrive_reads_a_truncated_letters_original_from_the_source_topic(pipe):
    topics = pipe.worker.runtime.topics
    value = big_value()
    sent = await produce(pipe.settings, topics.inference_requests, value, key=b"big", gzip=True)
    dlq_offset, letter = await letter_for(pipe, topics.inference_requests, sent.offset)
    assert letter.truncated
    async with DeadLetters(pipe.settings) as letters:
        results = {r.offset: r for r in await letters.redrive(every=True, kind="undecodable",
                                                              source_topic=topics.inference_requests,
                                                              dry_run=True)}
        assert results[dlq_offset].action == "would_redrive" and results[dlq_offset].value_from == "source"
        (redriven,) = await letters.redrive([dlq_offset])
    assert redriven.action == "redriven" and redriven.value_from == "source", redriven
    copy = await read_record(pipe.settings, topics.inference_requests, 0, redriven.target_offset)
    assert copy.value == value and copy.key == b"big"


async def test_a_truncated_letter_whose_original_is_gone_is_refused(pipe):
    topics = pipe.worker.runtime.topics
    sent = await produce(pipe.settings, topics.inference_requests, big_value(), gzip=True)
    dlq_offset, letter = await letter_for(pipe, topics.inference_requests, sent.offset)
    assert letter.truncated
    admin = AIOKafkaAdminClient(bootstrap_servers=pipe.settings.kafka_bootstrap)
    await admin.start()
    try:  # retention passed: the source partition now starts after the original
        await admin.delete_records({TopicPartition(topics.inference_requests, 0): RecordsToDelete(sent.offset + 1)})
    finally:
        await admin.close()
    code, out = await cli(pipe, "dlq", "redrive", str(dlq_offset), "--json")
    assert code == 1, out
    (refused,) = json.loads(out)
    assert refused["action"] == "refused" and "no longer retained" in refused["detail"], refused
    async with DeadLetters(pipe.settings) as letters:
        (result,) = await letters.redrive([dlq_offset])
        assert result.action == "refused" and "no longer retained" in result.detail
        assert (await letters.show(dlq_offset)).redrives == []  # nothing recorded for a refusal
