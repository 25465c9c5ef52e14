"""What a principal may actually do on a secure broker, tried rather than read from the ACLs: write a
record, read one back, connect to PostgreSQL with one of the stack's logins. Shared by the secure-stack
and tenant tests."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from agentstream.devstack.private import PrivateStack
from agentstream.streams.kafka_auth import kafka_options


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
    """Whether ``principal`` gets a record the administrator just wrote (an unauthorized fetch returns
    nothing: aiokafka logs the refusal and keeps trying)."""
    await send(stack, "admin", topic, b"marker", "acl-check", 0)
    consumer = AIOKafkaConsumer(**kafka_options(stack.bootstrap, stack.auth(principal)), enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=5000)
    await consumer.start()
    try:
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


@contextlib.asynccontextmanager
async def connection(url: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(url)
    try:
        yield conn
    finally:
        await conn.close()
