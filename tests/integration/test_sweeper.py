"""The planner's sweeper: a request that was lost is re-driven; every run ends by its maximum duration."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from agentstream.services.worker import Worker, WorkerOptions
from agentstream.testing import Pipeline, end_offsets, isolated
from tests.integration.processes import wait_for

pytestmark = pytest.mark.slow
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")


async def test_a_lost_request_is_re_driven(settings):
    """The first model request vanishes from its topic before any inference worker read it (as if a
    service had committed it unprocessed): after the step timeout, the planner republishes it."""
    s = replace(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), step_timeout_s=2.0)
    async with Pipeline.start(s, WorkerOptions(backend="scripted", tool_modules=TOOLS),
                              services=("planner", "tools")) as pipe:
        topics = pipe.worker.runtime.topics
        run_id = await pipe.client.submit("What is 6 * 7?", tools=["calculator"], prefetch=False)
        tp = TopicPartition(topics.inference_requests, topics.partition_for(run_id))

        async def published() -> bool:
            return (await end_offsets(s, [tp]))[tp] > 0

        await wait_for(published, 30, "the model request")
        admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka_bootstrap)
        await admin.start()
        try:
            await admin.delete_records({tp: RecordsToDelete((await end_offsets(s, [tp]))[tp])})
        finally:
            await admin.close()

        inference = Worker(["inference"], s, WorkerOptions(backend="scripted"))
        stop = asyncio.Event()
        await inference.start()
        running = asyncio.create_task(inference.run(stop))
        try:
            result = await pipe.client.wait(run_id, timeout=60)
        finally:
            stop.set()
            await running
            await inference.close()
        assert result.ok and "42" in (result.answer or ""), result
        assert pipe.worker.planner.stats["redriven"] >= 1


async def test_every_run_ends_by_its_maximum_duration(settings, effects_table):
    """A run waiting for an approval nobody gives, with no deadline, fails as max_duration."""
    s = replace(isolated(settings, f"t{uuid.uuid4().hex[:8]}."), max_run_s=3.0)
    async with Pipeline.start(s, WorkerOptions(backend="scripted", tool_modules=TOOLS)) as pipe:
        run_id = await pipe.client.submit('[[tool:transfer {"amount": 5}]] [[answer:done]]', tools=["transfer"])
        result = await pipe.client.wait(run_id, timeout=60)
        assert result.status == "failed" and result.error_code == "max_duration", result
        assert 3000 <= result.duration_ms < 30_000
        effects = await (await pipe.client.pool()).fetchval("SELECT count(*) FROM test_effects WHERE run_id = $1",
                                                            run_id)
        assert effects == 0
