"""A three-node Kafka cluster (`agentstream dev up --brokers 3`): it starts, carries the pipeline with
replicated topics, loses nothing when a broker is killed mid-run, brings the broker back, and stops."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from agentstream.devstack import process
from agentstream.devstack.private import free_kafka_port
from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.settings import Settings
from agentstream.testing import Pipeline
from tests.integration.processes import ROOT, start_worker, stop, wait_for

pytestmark = pytest.mark.slow
RUNS = 16
TASK = '[[slow:200]] [[tool:effect {"label": "first"}]] [[tool:effect {"label": "second"}]] [[answer:done]]'


def dev(env: dict[str, str], *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentstream.cli", "dev", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def status(env: dict[str, str]) -> dict:
    return json.loads(dev(env, "status", "--json").stdout)


async def topic_layout(bootstrap: str, topic: str) -> tuple[set[int], str]:
    """The replica counts of the topic's partitions, and its min.insync.replicas."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        replicas = {len(p["replicas"]) for p in described["partitions"]}
        (configs,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
        isr = next(value for name, value, *_ in configs.resources[0][4] if name == "min.insync.replicas")
    finally:
        await admin.close()
    return replicas, isr


async def test_a_three_broker_cluster_loses_nothing_when_a_broker_dies(database_url, effects_table, tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "AGENTSTREAM_KAFKA_PORT")}
    env.update(AGENTSTREAM_STATE_DIR=str(tmp_path / "state"), AGENTSTREAM_KAFKA_PORT=str(free_kafka_port(3)),
               DATABASE_URL=database_url)  # the session's database: only Kafka is started here
    up = dev(env, "up", "--brokers", "3")
    assert up.returncode == 0, up.stdout + up.stderr
    planner = None
    back: dict = {"brokers": []}
    try:
        cluster = status(env)
        assert cluster["running"] and [b["node_id"] for b in cluster["brokers"]] == [1, 2, 3]
        assert all(b["running"] and b["pid"] for b in cluster["brokers"])
        bootstrap = cluster["kafka"]
        assert len(bootstrap.split(",")) == 3

        s = Settings(kafka_bootstrap=bootstrap, database_url=database_url, external_kafka=True,
                     external_database=True, topic_prefix=f"t{uuid.uuid4().hex[:8]}.", partitions=4,
                     replication_factor=3, session_timeout_ms=6000)
        options = WorkerOptions(backend="scripted", tool_modules=("tests.integration.pipeline_tools",))
        async with Pipeline.start(s, options) as pipe:
            planner = start_worker(s, "planner", tmp_path / "planner.log")  # a second planner, as a process
            assert await topic_layout(bootstrap, pipe.client.topics.tasks) == ({3}, "2")
            pool = await pipe.client.pool()
            run_ids = [await pipe.client.submit(TASK, tools=["effect"], max_steps=8) for _ in range(RUNS)]

            async def some_effects() -> bool:
                return await pool.fetchval("SELECT count(*) FROM test_effects WHERE run_id = ANY($1)", run_ids) >= 4

            await wait_for(some_effects, 60, "four effects")
            victim = cluster["brokers"][1]
            os.kill(victim["pid"], signal.SIGKILL)  # no clean shutdown: its partitions' leaders move
            results = await asyncio.gather(*(pipe.client.wait(r, timeout=120) for r in run_ids))
            assert all(r.ok for r in results), [r for r in results if not r.ok]
            rows = await pool.fetch("SELECT run_id, label, count(*) AS n FROM test_effects WHERE run_id = ANY($1) "
                                    "GROUP BY run_id, label", run_ids)
            assert {(r["run_id"], r["label"]) for r in rows} == {(r, lbl) for r in run_ids
                                                                 for lbl in ("first", "second")}
            assert all(r["n"] == 1 for r in rows), [dict(r) for r in rows if r["n"] != 1]
            dupes = await pool.fetchval(
                "SELECT count(*) FROM (SELECT step_id, event_type FROM events WHERE run_id = ANY($1) "
                "GROUP BY step_id, event_type HAVING count(*) > 1) d", run_ids)
            assert dupes == 0

            assert not status(env)["running"]
            again = dev(env, "up")  # starts the node that died, with its data
            assert again.returncode == 0, again.stdout + again.stderr
            back = status(env)
            assert back["running"] and back["brokers"][1]["pid"] != victim["pid"]
            run_id = await pipe.client.submit("What is 2 + 2?", tools=[])
            assert (await pipe.client.wait(run_id, timeout=60)).ok
    finally:
        if planner is not None:
            stop(planner)
        down = dev(env, "down", "--purge")
        assert down.returncode == 0, down.stdout + down.stderr
    assert "kafka" in down.stdout
    refs = [process.ProcessRef.of(b["pid"]) for b in back["brokers"]]
    assert len(refs) == 3 and not any(ref and ref.alive() for ref in refs)  # a reaped-late zombie is not alive
