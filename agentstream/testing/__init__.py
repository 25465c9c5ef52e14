"""A test harness users can import.

Without Kafka or PostgreSQL (unit tests, in milliseconds):

- ``ToolEnvironment``: run one of your ``@tool`` functions as the tool service runs it, and get its
  result or the ``ToolError`` the run would hear (``agentstream.testing.tools``);
- ``ToolHarness``: the tool service itself, with your tools, on an in-memory broker and database: the
  check against the run, retries, the recorded result, a redelivery (``agentstream.testing.tools``);
- ``InMemoryBroker``: topics in memory and a ``Runtime`` that publishes into them; ``deliver`` hands an
  event to a service's handler as the runtime would, once (``agentstream.testing.broker``);
- ``InMemoryDatabase``: the tool service's statements answered from dictionaries
  (``agentstream.testing.database``).

On a real broker and database, ``Pipeline``: the whole pipeline in-process, on its own topics.

    async with Pipeline.start(settings, WorkerOptions(backend="scripted")) as pipe:
        run_id = await pipe.client.submit("What is 2 + 2?", tools=["calculator"])
        result = await pipe.client.wait(run_id, timeout=30)

It runs against the broker and database ``settings`` name; give each test its own ``topic_prefix`` to
keep them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.services.worker import SERVICES, Worker, WorkerOptions
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import Event
from agentstream.streams.kafka.codec import codec_for
from agentstream.testing.broker import Handled, InMemoryBroker
from agentstream.testing.database import InMemoryDatabase
from agentstream.testing.tools import ToolEnvironment, ToolHarness


@dataclass
class Pipeline:
    """The whole pipeline in one process, for tests: the services as one ``Worker`` and an
    ``AgentClient`` (``client``) on the broker and database that ``settings`` name.

    ``Pipeline.start(settings, options)`` is an async context manager: it waits until the workers have
    joined their groups, and at the end stops them and (with a topic prefix) deletes the prefix's
    topics. It exists so that a test can run real runs end to end without starting processes.
    """

    settings: Settings
    worker: Worker
    client: AgentClient

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, settings: Settings, options: WorkerOptions | None = None,
                    services: Sequence[str] = SERVICES, join_timeout: float = 60.0,
                    delete_topics: bool | None = None) -> AsyncIterator[Pipeline]:
        """``delete_topics`` (default: when the settings have a topic prefix) removes the prefix's topics
        afterwards, so repeated test runs do not pile topics up on a long-lived broker."""
        worker = Worker(services, settings, options)
        stop = asyncio.Event()
        await worker.start()
        task = asyncio.create_task(worker.run(stop))
        client = AgentClient(settings)
        try:
            joined = asyncio.create_task(worker.wait_joined(join_timeout))
            done, _ = await asyncio.wait([joined, task], return_when=asyncio.FIRST_COMPLETED)
            if task in done:
                joined.cancel()
                task.result()  # raises what stopped the worker
            await joined
            await client.start()
            yield cls(settings, worker, client)
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()
            await worker.close()
            if delete_topics if delete_topics is not None else bool(settings.topic_prefix):
                await worker.runtime.topics.delete_all(settings.kafka_bootstrap, auth=settings.kafka_auth)


async def end_offsets(settings: Settings, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Where each partition ends now (to read what is published after)."""
    consumer = AIOKafkaConsumer(**settings.kafka_options())
    await consumer.start()
    try:
        return await consumer.end_offsets(tps)
    finally:
        await consumer.stop()


async def read_events(settings: Settings, tp: TopicPartition, start: int, *, expect: int,
                      timeout: float = 15.0) -> list[Event]:
    """Decode the events of one partition from ``start``: ``expect`` of them, or what came in ``timeout``."""
    codec = codec_for(settings)
    consumer = AIOKafkaConsumer(**settings.kafka_options(), enable_auto_commit=False)
    await consumer.start()
    out: list[Event] = []
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout
        while len(out) < expect and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=300)
            out.extend([await codec.decode_async(m.value) for m in batch.get(tp, [])])
    finally:
        await consumer.stop()
        await codec.close()
    return out


def isolated(settings: Settings, prefix: str, *, partitions: int = 4) -> Settings:
    """The same broker and database, with topics and groups of their own."""
    return replace(settings, topic_prefix=prefix, partitions=partitions)


async def wait_awaiting_approval(client: AgentClient, run_id: str, timeout: float = 10.0) -> dict:
    """The approval request of ``run_id`` (``AgentClient.awaiting_approval``) once the run waits for a
    person; AssertionError when it does not within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for waiting in await client.awaiting_approval():
            if waiting["run_id"] == run_id:
                return waiting
        await asyncio.sleep(0.05)
    raise AssertionError(f"{run_id} never waited for approval")


__all__ = ["Handled", "InMemoryBroker", "InMemoryDatabase", "Pipeline", "ToolEnvironment", "ToolHarness",
           "end_offsets", "isolated", "read_events", "wait_awaiting_approval"]
