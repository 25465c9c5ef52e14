"""What a principal may actually do on a secure broker, tried rather than read from the ACLs: write a
record, read one back, connect to PostgreSQL with one of the stack's logins, find what became of a
record (its dead letter). Shared by the secure-stack tests and the hostile-client suite."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from agentstream.devstack.private import PrivateStack
from agentstream.streams.config.kafka_auth import kafka_options
from agentstream.streams.core.events import DeadLetter
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import end_offsets, read_events


def producer(stack: PrivateStack, principal: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(**kafka_options(stack.bootstrap, stack.auth(principal)), acks="all",
                            request_timeout_ms=5000)


async def send(stack: PrivateStack, principal: str, topic: str, value: bytes, key: str,
               partition: int) -> tuple[int, int]:
    """Publish as ``principal``; return where the record landed (partition, offset)."""
    out = producer(stack, principal)
    await out.start()
    try:
        meta = await out.send_and_wait(topic, value, key=key.encode(), partition=partition)
    finally:
        await out.stop()
    return meta.partition, meta.offset


async def can_write(stack: PrivateStack, principal: str, topic: str) -> bool:
    out = producer(stack, principal)
    await out.start()
    try:
        await out.send_and_wait(topic, b"not an event", key=b"acl-check")
        return True
    except TopicAuthorizationFailedError:
        return False
    finally:
        await out.stop()


async def can_read(stack: PrivateStack, principal: str, topic: str) -> bool:
    """Whether ``principal`` gets a record the administrator just wrote. Kafka lists to a principal only
    the topics it may describe, and reading implies describing: a topic missing from its list is one it
    cannot read, known at once (its fetches would return nothing, aiokafka logging the refusal and
    trying again, until this gave up after 3 s). A principal that may describe the topic but not read it
    has its fetch refused (TopicAuthorizationFailedError)."""
    await send(stack, "admin", topic, b"marker", "acl-check", 0)
    consumer = AIOKafkaConsumer(**kafka_options(stack.bootstrap, stack.auth(principal)), enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=5000)
    await consumer.start()
    try:
        if topic not in await consumer.topics():
            return False
        consumer.assign([TopicPartition(topic, 0)])
        for _ in range(6):
            try:
                if any((await consumer.getmany(timeout_ms=500)).values()):
                    return True
            except TopicAuthorizationFailedError:
                return False
        return False
    finally:
        await consumer.stop()


async def dead_letter(stack: PrivateStack, prefix: str, source_topic: str, source: tuple[int, int], *,
                      timeout: float = 60) -> DeadLetter:
    """The dead letter of the record at ``source`` (partition, offset) of ``source_topic``, read from the
    dead-letter topic under ``prefix`` as the operator (who may read it)."""
    settings = stack.settings(topic_prefix=prefix, principal="operator")
    dlq = TopicPartition(Topics(prefix).dlq, 0)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        end = (await end_offsets(settings, [dlq]))[dlq]
        for letter in await read_events(settings, dlq, 0, expect=end, timeout=5) if end else []:
            if (isinstance(letter, DeadLetter) and letter.source_topic == source_topic
                    and (letter.source_partition, letter.source_offset) == source):
                return letter
        await asyncio.sleep(0.3)
    raise AssertionError(f"no dead letter for the record at {source_topic} {source}")


@contextlib.asynccontextmanager
async def connection(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()
