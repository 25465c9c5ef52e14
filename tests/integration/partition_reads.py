"""Reading what a partition holds *now*, for tests: up to its end offset, so that no test waits out a
timeout for events that will never come (``agentstream.testing.read_events`` stops at a count or a
timeout; asking it for "everything" costs its whole timeout)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import Event
from agentstream.streams.kafka.codec import codec_for


async def read_to_end(settings: Settings, tps: list[TopicPartition], start: int = 0, *,
                      timeout: float = 15.0) -> list[Event]:
    """The events of ``tps`` from offset ``start`` up to where each partition ends when this is called,
    partition by partition, in offset order. Stops at the end offset, not at a count: a compacted topic
    has gaps and a transaction's markers take offsets, so a count of records could wait for ever."""
    codec = codec_for(settings)
    consumer = AIOKafkaConsumer(**settings.kafka_options(), enable_auto_commit=False)
    await consumer.start()
    out: dict[TopicPartition, list[Event]] = {tp: [] for tp in tps}
    try:
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, start)
        deadline = time.monotonic() + timeout
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{tps} not read to their end offsets {ends} within {timeout:.0f} s")
            for tp, records in (await consumer.getmany(*tps, timeout_ms=300)).items():
                out[tp].extend([await codec.decode_async(r.value) for r in records if r.offset < ends[tp]])
    finally:
        await consumer.stop()
        await codec.close()
    return [event for tp in tps for event in out[tp]]


async def read_until(settings: Settings, tps: list[TopicPartition], done: Callable[[list[Event]], bool], *,
                     start: int = 0, timeout: float = 30.0) -> list[Event]:
    """``read_to_end`` again until ``done`` holds of what it read (an event the test waits for is there),
    or ``timeout`` passes; returns the last read either way, for the test's assertions to judge."""
    deadline = time.monotonic() + timeout
    while True:
        events = await read_to_end(settings, tps, start, timeout=timeout)
        if done(events) or time.monotonic() > deadline:
            return events
        await asyncio.sleep(0.1)
