"""``agentstream dev check``: prove the stack works end to end in a few seconds.

Creates a throwaway topic, produces a keyed record with acks=all, consumes it back in a group and
commits, round-trips a vector through PostgreSQL's pgvector, and reports each step's time.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import TopicSpec
from agentstream.streams.store import db


@dataclass(frozen=True)
class CheckStep:
    name: str
    detail: str
    ms: float


async def run_check(settings: Settings) -> list[CheckStep]:
    steps: list[CheckStep] = []
    token = uuid.uuid4().hex[:8]
    topic = f"agentstream.check.{token}"

    t0 = time.perf_counter()
    await ensure_topics(settings.kafka_bootstrap, [TopicSpec(topic, partitions=1)], auth=settings.kafka_auth)
    steps.append(CheckStep("create topic", topic, _ms(t0)))
    try:
        t0 = time.perf_counter()
        producer = AIOKafkaProducer(**settings.kafka_options(), acks="all",
                                    enable_idempotence=True)
        await producer.start()
        try:
            meta = await producer.send_and_wait(topic, key=token.encode(), value=b"hello from agentstream")
        finally:
            await producer.stop()
        steps.append(CheckStep("produce (acks=all)", f"partition {meta.partition} offset {meta.offset}", _ms(t0)))

        t0 = time.perf_counter()
        consumer = AIOKafkaConsumer(topic, **settings.kafka_options(),
                                    group_id=f"agentstream-check-{token}", auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            msg = await consumer.getone()
            await consumer.commit()
        finally:
            await consumer.stop()
        key, value = (msg.key or b"").decode(), (msg.value or b"").decode()  # both set: produced above
        steps.append(CheckStep("consume + commit", f"{key} -> {value}", _ms(t0)))
    finally:
        admin = AIOKafkaAdminClient(**settings.kafka_options())
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()

    t0 = time.perf_counter()
    conn = await db.connect(settings.database_url)
    try:
        version = await conn.fetchval("SHOW server_version")
        distance = await conn.fetchval("SELECT '[1,0,0]'::vector <=> '[0,1,0]'::vector")
    finally:
        await conn.close()
    steps.append(CheckStep("postgres + pgvector", f"PostgreSQL {version}, cosine distance {distance:.1f}", _ms(t0)))
    return steps


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
