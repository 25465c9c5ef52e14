"""A faust Table survives a worker restart: the new worker recovers it from its changelog topic."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

APP = Path(__file__).with_name("faust_counter_app.py")
pytestmark = pytest.mark.slow


def _start_worker(env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, str(APP), "worker", "-l", "warn"], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=APP.parent)


def _stop_worker(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _dump(worker: subprocess.Popen, producer: AIOKafkaProducer, in_topic: str,
                consumer: AIOKafkaConsumer, expect: dict[str, int], timeout: float) -> dict[str, int]:
    """Ask the worker for its table until it matches ``expect`` or time runs out; the last dump."""
    table: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and worker.poll() is None:
        await producer.send_and_wait(in_topic, key=b"dump", value=b"dump")
        batch = await consumer.getmany(timeout_ms=2000)
        for messages in batch.values():
            for msg in messages:
                table = json.loads(msg.value)
        if table == expect:
            return table
    return table


async def _truncate(bootstrap: str, topic: str, partitions: int) -> None:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await probe.start()
    try:
        ends = await probe.end_offsets(tps)
    finally:
        await probe.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({tp: RecordsToDelete(before_offset=ends[tp]) for tp in tps})
    finally:
        await admin.close()


async def test_table_restored_from_changelog_after_restart(kafka_bootstrap, topic_factory, unique, tmp_path):
    in_topic = await topic_factory("faust-in", partitions=2)
    out_topic = await topic_factory("faust-out")
    env = {**os.environ, "APP_ID": f"counter-{unique}", "BOOTSTRAP": kafka_bootstrap,
           "IN_TOPIC": in_topic, "OUT_TOPIC": out_topic, "DATADIR": str(tmp_path / "faust")}
    expected = {f"user-{i}": i + 1 for i in range(12)}

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    consumer = AIOKafkaConsumer(out_topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="latest")
    await producer.start()
    await consumer.start()
    log = tmp_path / "faust.log"
    worker = _start_worker(env, log)
    try:
        for key, n in expected.items():
            for _ in range(n):
                await producer.send(in_topic, key=key.encode(), value=b"inc")
        await producer.flush()
        before = await _dump(worker, producer, in_topic, consumer, expected, timeout=90)
        assert before == expected, f"first worker's table: {before}\n{log.read_text()[-3000:]}"
        await asyncio.sleep(1.0)  # let the worker commit its offsets (every 0.2 s)
        _stop_worker(worker)
        # Erase the input, so the only way back to the counts is the table's changelog topic.
        await _truncate(kafka_bootstrap, in_topic, partitions=2)

        worker = _start_worker(env, log)
        after = await _dump(worker, producer, in_topic, consumer, expected, timeout=90)
        assert after == expected, f"restarted worker's table: {after}\n{log.read_text()[-3000:]}"
    finally:
        _stop_worker(worker)
        await consumer.stop()
        await producer.stop()
