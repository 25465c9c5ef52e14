"""Outages in the middle of a load, on a broker and a database of the test's own (agentstream/devstack/private.py):
PostgreSQL stopped for 15 s, the broker killed and restarted, a planner paused past its session timeout.
Every run completes, every side effect happens once, no snapshot goes back in version."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.devstack.private import PrivateStack
from agentstream.devstack.process import free_port
from agentstream.services.worker import WorkerOptions
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import RunStateSnapshot
from agentstream.streams.kafka.codec import codec_for
from agentstream.testing import Pipeline
from tests.integration import pipeline_tools
from tests.integration.processes import private_stack, start_worker, stop, wait_for_members

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")
TASK = '[[slow:200]] [[tool:effect {"label": "a"}]] [[tool:effect {"label": "b"}]] [[answer:done]]'


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory) -> AsyncIterator[PrivateStack]:
    async with private_stack(tmp_path_factory.mktemp("private-stack")) as private:
        yield private


class Load:
    """Runs submitted steadily by a client that keeps going through the fault."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        self.run_ids: list[str] = []
        self.errors: list[str] = []

    async def submit(self, count: int, every_s: float) -> None:
        for _ in range(count):
            try:
                self.run_ids.append(await self.pipe.client.submit(TASK, tools=["effect"], max_steps=8, deadline=240))
            except Exception as exc:  # counted: the assertion names them
                self.errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(every_s)

    async def settle(self, runs: int = 3, timeout: float = 120) -> None:
        """Until ``runs`` runs submitted from now on have completed: work flows through whichever processes
        hold the partitions now (rather than a fixed sleep before a fault, or during one)."""
        first = len(self.run_ids)
        deadline = time.monotonic() + timeout
        while len(self.run_ids) < first + runs:
            assert time.monotonic() < deadline and not self.errors, ("no runs submitted", self.errors)
            await asyncio.sleep(0.05)
        await asyncio.gather(*(self.pipe.client.wait(r, timeout=timeout) for r in self.run_ids[first:first + runs]))

    async def check(self, pool_url: str) -> None:
        assert self.errors == [], "submit failed during the fault"
        results = await asyncio.gather(*(self.pipe.client.wait(r, timeout=240) for r in self.run_ids))
        assert [r for r in results if not r.ok] == []
        conn = await asyncpg.connect(pool_url)
        try:
            rows = await conn.fetch("SELECT run_id, label, count(*) AS n FROM test_effects WHERE run_id = ANY($1) "
                                    "GROUP BY run_id, label", self.run_ids)
        finally:
            await conn.close()
        assert {(r["run_id"], r["label"]) for r in rows} == {(r, lbl) for r in self.run_ids for lbl in ("a", "b")}
        assert [(r["run_id"], r["label"], r["n"]) for r in rows if r["n"] != 1] == [], "an effect happened twice"


async def _pipeline(stack: PrivateStack, tmp_path, planners: int = 2, metrics_port: int | None = None):
    """Inference and tools in this process, ``planners`` planner processes (the first one serving
    /readyz on ``metrics_port``)."""
    settings = stack.settings(topic_prefix=f"t{uuid.uuid4().hex[:8]}.", partitions=4)
    options = WorkerOptions(backend="scripted", tool_modules=TOOLS)
    pipe_cm = Pipeline.start(settings, options, services=("inference", "tools"))
    pipe = await pipe_cm.__aenter__()
    procs = [start_worker(settings, "planner", tmp_path / f"planner{i}.log",
                          **({"AGENTSTREAM_METRICS_PORT": str(metrics_port)} if metrics_port and i == 0 else {}))
             for i in range(planners)]
    await wait_for_members(settings.kafka_bootstrap, pipe.worker.runtime.topics.group("planner"), planners)
    return pipe_cm, pipe, procs


async def _readyz(port: int) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/readyz") as response:
        return response.status, await response.text()


async def test_postgres_stopped_for_15_s_mid_load(stack, tmp_path):
    """Submitting goes on (Kafka is the intake); the planners wait the outage out, saying so on /readyz."""
    port = free_port()
    pipe_cm, pipe, procs = await _pipeline(stack, tmp_path, metrics_port=port)
    try:
        load = Load(pipe)
        submitting = asyncio.create_task(load.submit(60, 0.5))
        await load.settle()  # runs complete, and more are in flight, when the database stops
        await stack.stop_postgres()
        reported = []
        stopped_at = time.monotonic()
        while time.monotonic() - stopped_at < 15:  # (30 s before: no more is learnt from longer)
            status, why = await _readyz(port)
            if status == 503 and "database" in why:
                reported.append(why)
            await asyncio.sleep(0.5)
        await stack.start_postgres()
        await submitting
        await load.check(stack.database_url)
        assert reported, "the planner's /readyz never reported the database outage"
        assert (await _readyz(port))[0] == 200
    finally:
        for proc in procs:
            stop(proc)
        await pipe_cm.__aexit__(None, None, None)


async def test_a_tool_stopped_by_a_database_outage_runs_again_once(stack, tmp_path):
    """The tool's own write fails because PostgreSQL stops under it: the call is not answered as a tool
    error (the model would go on without the effect) nor as "interrupted" — it runs again, as attempt 2,
    once the database is back, and its effect happens once."""
    pipe_cm, pipe, procs = await _pipeline(stack, tmp_path, planners=1)
    pipeline_tools.GATE.clear()
    pipeline_tools.ENTERED.clear()
    try:
        run_id = await pipe.client.submit('[[tool:gated_effect {"label": "g"}]] [[answer:done]]',
                                          tools=["gated_effect"], deadline=240)
        await asyncio.wait_for(pipeline_tools.ENTERED.wait(), 60)
        await stack.stop_postgres()
        pipeline_tools.GATE.set()
        await asyncio.sleep(3)
        await stack.start_postgres()
        assert (await pipe.client.wait(run_id, timeout=120)).ok
        conn = await asyncpg.connect(stack.database_url)
        try:
            effects = await conn.fetchval("SELECT count(*) FROM test_effects WHERE run_id = $1", run_id)
            call = await conn.fetchrow("SELECT status, attempts, error FROM tool_calls WHERE run_id = $1", run_id)
        finally:
            await conn.close()
        assert effects == 1
        assert (call["status"], call["attempts"], call["error"]) == ("succeeded", 2, None)
    finally:
        pipeline_tools.GATE.set()
        for proc in procs:
            stop(proc)
        await pipe_cm.__aexit__(None, None, None)


async def test_broker_killed_and_restarted_mid_load(stack, tmp_path):
    pipe_cm, pipe, procs = await _pipeline(stack, tmp_path)
    try:
        load = Load(pipe)
        submitting = asyncio.create_task(load.submit(40, 0.25))
        await load.settle()
        await stack.kill_kafka()
        await asyncio.sleep(3)
        await stack.start_kafka()
        await submitting
        await load.check(stack.database_url)
    finally:
        for proc in procs:
            stop(proc)
        await pipe_cm.__aexit__(None, None, None)


async def test_a_paused_planner_is_fenced(stack, tmp_path):
    """SIGSTOP one of two planners until its session has timed out (6 s), its partitions have moved and its
    successor has got on with the runs, then SIGCONT: nothing it had in flight is published over its
    successor's work."""
    pipe_cm, pipe, procs = await _pipeline(stack, tmp_path)
    try:
        load = Load(pipe)
        submitting = asyncio.create_task(load.submit(60, 0.25))
        await load.settle()
        procs[0].send_signal(signal.SIGSTOP)
        await wait_for_members(pipe.settings.kafka_bootstrap, pipe.worker.runtime.topics.group("planner"), 1)
        await load.settle()  # completed by the successor alone
        procs[0].send_signal(signal.SIGCONT)
        await submitting
        await load.check(stack.database_url)
        await _assert_snapshots_never_go_back(pipe, load.run_ids)
        log = (tmp_path / "planner0.log").read_text()
        assert "stalled" in log  # it noticed the pause, so it re-checked its leases before publishing
    finally:
        for proc in procs:
            stop(proc)
        await pipe_cm.__aexit__(None, None, None)


async def _assert_snapshots_never_go_back(pipe: Pipeline, run_ids: list[str]) -> None:
    topics = pipe.worker.runtime.topics
    codec = codec_for(pipe.settings)
    consumer = AIOKafkaConsumer(bootstrap_servers=pipe.settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    versions: dict[str, list[int]] = {}
    try:
        tps = [TopicPartition(topics.runs, p) for p in range(pipe.settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    try:
                        event = codec.decode(record.value)
                    except DecodeError:
                        continue
                    if isinstance(event, RunStateSnapshot):
                        versions.setdefault(event.run_id, []).append(event.version)
    finally:
        await consumer.stop()
    wanted = set(run_ids)
    regressions = {r: v for r, v in versions.items() if r in wanted and v != sorted(v)}
    assert regressions == {}
    assert wanted <= set(versions)
