"""Kafka and PostgreSQL on test hosts of their own (network namespaces, bench/netsim/testnet.py), reached by a
client on a third host across the link emulator: what bench/netsim/regions.py is built on.

Checks that the launchers serve on a host's address (``KafkaLauncher.host``, ``PostgresLauncher.host``),
that a client on another host produces, consumes and queries across the emulator, and that a delay set
on the client's host lengthens every round trip by at least that much (a lower bound: no packet can
arrive before its delay; nothing here depends on how fast the machine is).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentstream.devstack import process
from bench.netsim.regions import start_server
from bench.netsim.testnet import TestNetwork, available

pytestmark = pytest.mark.slow
UNAVAILABLE = available()
DELAY_MS = 30

CLIENT = textwrap.dedent("""
    import asyncio, json, sys, time
    import asyncpg
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    async def main(bootstrap, url, expected):
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic("hosts.check", 1, 1)])
        except Exception:
            pass  # made by the first pass
        await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
        await producer.start()
        produce = []
        for i in range(20):
            t = time.perf_counter()
            await producer.send_and_wait("hosts.check", str(i).encode())
            produce.append(1000 * (time.perf_counter() - t))
        await producer.stop()
        consumer = AIOKafkaConsumer("hosts.check", bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        await consumer.start()
        values = []
        while len(values) < expected:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                values += [int(r.value) for r in records]
        await consumer.stop()
        conn = await asyncpg.connect(url)
        query = []
        for _ in range(10):
            t = time.perf_counter()
            await conn.fetchval("SELECT 1")
            query.append(1000 * (time.perf_counter() - t))
        await conn.close()
        print(json.dumps({"produce_min_ms": min(produce), "query_min_ms": min(query), "values": values}))

    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
""")


@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no test hosts here: {UNAVAILABLE}")
def test_parts_on_separate_hosts_talk_across_the_emulator_and_feel_its_delay(tmp_path: Path):
    net = TestNetwork(["kafka", "postgres", "client"], prefix="ast", subnet="10.78.0").up()
    pids: list[int] = []
    try:
        kafka = start_server(net, "kafka", tmp_path, 1)
        postgres = start_server(net, "postgres", tmp_path, 1)
        pids = kafka["pids"] + postgres["pids"]
        assert kafka["bootstrap"] == f"{net.hosts['kafka']}:9092"
        assert postgres["url"].split("@")[1].startswith(f"{net.hosts['postgres']}:5432/")

        def client(expected: int) -> dict:
            done = subprocess.run([*net.exec_argv("client"), sys.executable, "-c", CLIENT, kafka["bootstrap"],
                                   postgres["url"], str(expected)], capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-3000:]
            return json.loads(done.stdout.strip().splitlines()[-1])

        near = client(20)
        net.shape("client", DELAY_MS)
        far = client(40)
    finally:
        for pid in pids:
            process.stop(process.ProcessRef.of(pid), grace=30)
        net.down()
        if pids:
            shutil.rmtree(postgres["work_dir"], ignore_errors=True)
    assert near["values"] == list(range(20))  # the first pass created the topic and wrote 0..19
    assert far["values"] == list(range(20)) * 2
    for key in ("produce_min_ms", "query_min_ms"):
        assert far[key] >= DELAY_MS, (key, far[key])
        assert far[key] > near[key], (key, near[key], far[key])
    assert not any(process.ProcessRef.of(pid) and process.ProcessRef.of(pid).alive() for pid in pids)  # type: ignore[union-attr]
