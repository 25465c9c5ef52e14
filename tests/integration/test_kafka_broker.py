"""The broker is real Kafka and behaves like it: committed offsets, transactions, compaction."""

from __future__ import annotations

import asyncio
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

N_MESSAGES = 10_000


async def _produce_all(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]], **kw) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **kw)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def test_consumer_resumes_from_committed_offsets(kafka_bootstrap, topic_factory, unique):
    """10,000 keyed messages; a consumer stops part-way and a new one in the same group resumes from
    the committed offsets: every message seen exactly once, and per-key order holds."""
    topic = await topic_factory("resume", partitions=4)
    records = [(f"key-{i % 97}".encode(), str(i).encode()) for i in range(N_MESSAGES)]
    await _produce_all(kafka_bootstrap, topic, records, enable_idempotence=True)

    group = f"resume-{unique}"
    seen: list[tuple[str, int]] = []

    def consumer() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=group,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                max_poll_records=500)

    first = consumer()
    await first.start()
    committed: dict[TopicPartition, int] = {}
    try:
        while len(seen) < 4_000:
            batch = await first.getmany(timeout_ms=1000)
            for tp, messages in batch.items():
                for msg in messages:
                    seen.append((msg.key.decode(), int(msg.value)))
                committed[tp] = messages[-1].offset + 1
            # Commit exactly what was processed (an explicit map, never "whatever was fetched").
            if committed:
                await first.commit(dict(committed))
    finally:
        await first.stop()
    stopped_after = len(seen)
    assert 4_000 <= stopped_after < N_MESSAGES

    second = consumer()
    await second.start()
    try:
        first_offsets: dict[TopicPartition, int] = {}
        tps = [TopicPartition(topic, p) for p in range(4)]
        ends = await second.end_offsets(tps)  # nothing is produced any more: where the topic ends for good

        async def behind() -> bool:
            return second.assignment() != set(tps) or any([await second.position(tp) < ends[tp] for tp in tps])

        # Read to the end of every partition, not to a count: all it delivers is counted (a duplicate
        # too), with no draining wait afterwards.
        deadline = time.monotonic() + 60
        while await behind() and time.monotonic() < deadline:
            batch = await second.getmany(timeout_ms=1000)
            for tp, messages in batch.items():
                first_offsets.setdefault(tp, messages[0].offset)
                seen.extend((m.key.decode(), int(m.value)) for m in messages)
    finally:
        await second.stop()

    values = [v for _, v in seen]
    assert len(values) == N_MESSAGES, f"expected {N_MESSAGES}, got {len(values)}"
    assert sorted(values) == list(range(N_MESSAGES)), "lost or duplicated messages"
    for tp, offset in first_offsets.items():
        assert offset == committed.get(tp, 0), f"{tp} resumed at {offset}, committed {committed.get(tp)}"
    last: dict[str, int] = {}
    for key, value in seen:
        assert value > last.get(key, -1), f"order broken for {key}"
        last[key] = value


async def _read_all(bootstrap: str, topic: str, isolation: str, timeout: float = 30) -> list[bytes]:
    """Every record ``isolation`` lets a consumer see, read to the end of the (single-partition) topic:
    every transaction has ended, so its end is where read_committed stops too; nothing is left to wait for."""
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
    await consumer.start()
    got: list[bytes] = []
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + timeout
        while await consumer.position(tp) < end and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            got.extend(m.value for m in batch.get(tp, []))
    finally:
        await consumer.stop()
    return got


async def test_idempotent_and_transactional_producers(kafka_bootstrap, topic_factory, unique):
    topic = await topic_factory("txn")
    # Idempotent producer: acks=all with sequence numbers (the broker must accept InitProducerId).
    await _produce_all(kafka_bootstrap, topic, [(b"i", b"idempotent")], enable_idempotence=True)

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"tx-{unique}",
                                enable_idempotence=True, acks="all")
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(5):
                await producer.send(topic, key=b"c", value=f"committed-{i}".encode())
        await producer.begin_transaction()
        for i in range(5):
            await producer.send(topic, key=b"a", value=f"aborted-{i}".encode())
        await producer.abort_transaction()
        async with producer.transaction():
            for i in range(5, 10):
                await producer.send(topic, key=b"c", value=f"committed-{i}".encode())
    finally:
        await producer.stop()

    committed = await _read_all(kafka_bootstrap, topic, "read_committed")
    assert committed == [b"idempotent"] + [f"committed-{i}".encode() for i in range(10)]
    # The aborted records are in the log: only read_committed hides them.
    uncommitted = await _read_all(kafka_bootstrap, topic, "read_uncommitted")
    assert sorted(v for v in uncommitted if v.startswith(b"aborted")) == [f"aborted-{i}".encode() for i in range(5)]


async def test_compacted_topic_keeps_latest_value_and_drops_tombstones(kafka_bootstrap, topic_factory):
    topic = await topic_factory("compact", configs={
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100",
        "min.compaction.lag.ms": "0",
    })
    keys = [f"k{i}".encode() for i in range(20)]
    records: list[tuple[bytes, bytes | None]] = []
    for version in range(5):
        records += [(k, f"{k.decode()}-v{version}".encode()) for k in keys]
    tombstoned = set(keys[:5])
    records += [(k, None) for k in tombstoned]
    await _produce_all(kafka_bootstrap, topic, records)
    expected = {k: f"{k.decode()}-v4".encode() for k in keys if k not in tombstoned}

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    last_view: list[tuple[bytes, bytes | None]] = []
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            # The active segment is never cleaned: a fresh record after segment.ms rolls it.
            await producer.send_and_wait(topic, key=b"__roll", value=uuid.uuid4().bytes)
            last_view = await _read_from_beginning(kafka_bootstrap, topic)
            data = [(k, v) for k, v in last_view if k != b"__roll"]
            if len(data) == len(expected) and dict(data) == expected:
                break
            await asyncio.sleep(1.0)
    finally:
        await producer.stop()
    data = [(k, v) for k, v in last_view if k != b"__roll"]
    assert dict(data) == expected, "latest values wrong or tombstoned keys still present"
    assert len(data) == len(expected), f"not compacted: {len(data)} records for {len(expected)} keys"


async def _read_from_beginning(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None]]:
    tp = TopicPartition(topic, 0)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        out: list[tuple[bytes, bytes | None]] = []
        while await consumer.position(tp) < end:
            batch = await consumer.getmany(tp, timeout_ms=1000)
            out.extend((m.key, m.value) for m in batch.get(tp, []))
        return out
    finally:
        await consumer.stop()
