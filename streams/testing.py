"""A test harness users can import: the whole pipeline in-process, on its own topics.

    async with Pipeline.start(settings, WorkerOptions(backend="scripted")) as pipe:
        run_id = await pipe.client.submit("What is 2 + 2?", tools=["calculator"])
        result = await pipe.client.wait(run_id, timeout=30)

It runs against a real broker and database (the ones ``settings`` name); give each test its own
``topic_prefix`` to keep them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace

from services.worker import SERVICES, Worker, WorkerOptions
from streams.client import AgentClient
from streams.config import Settings


@dataclass
class Pipeline:
    settings: Settings
    worker: Worker
    client: AgentClient

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, settings: Settings, options: WorkerOptions | None = None,
                    services: Sequence[str] = SERVICES, join_timeout: float = 60.0) -> AsyncIterator[Pipeline]:
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


def isolated(settings: Settings, prefix: str, *, partitions: int = 4) -> Settings:
    """The same broker and database, with topics and groups of their own."""
    return replace(settings, topic_prefix=prefix, partitions=partitions)
