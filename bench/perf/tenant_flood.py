"""One tenant floods a partition; what happens to another tenant's runs (issue 36, "Bad input").

A private secure stack (``PrivateStack(secure=True, tenants=("acme", "beta"))``, as ``agentstream dev up
--secure --tenant acme --tenant beta``) with each tenant's principal under its produce quota
(agentstream/ops/client_quotas.py; ``--rate``, default the dev stack's 1 MiB/s). Acme's cell runs a
planner, the scripted model and the built-in tools (one process each); beta's cell runs a planner, which
dead-letters what the flood writes. Three phases on the same stack, ``--runs`` runs of acme each (one at a
time: submit "What is 2 * 3?" with the calculator, three steps, wait for the outcome):

1. ``quiet``: nothing else;
2. ``flood, quota``: beta's principal writes junk records to partition 0 of its intake as fast as
   ``--producers`` producers can (records of ``--record-kb`` KiB), throughout the phase;
3. ``flood, no quota``: the same after beta's quota is removed.

``--rounds N`` runs the three N times, alternated (the quota set again each round, and 12 s between rounds
for the broker's quota windows to forget the flood), pooling each phase's runs. Reports each phase's acme
run latency (submit → outcome) p50/p99 and the rate the flood achieved.

    .venv/bin/python -m bench.perf.tenant_flood [--runs 200] [--rounds 1] [--rate 1048576] [--producers 2]
                                                [--record-kb 64] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer

from agentstream.devstack.private import PrivateStack
from agentstream.ops.acls import ADMIN, tenant_prefix, tenant_principal
from agentstream.ops.client_quotas import TenantKafkaQuota, apply_client_quotas
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.kafka_auth import kafka_options
from agentstream.streams.kafka.topics import Topics

ACME, BETA = "acme", "beta"
PARTITIONS = 4


@dataclass
class Phase:
    name: str
    latencies_ms: list[float]
    flood_bytes: int
    flood_s: float

    def summary(self) -> dict:
        ordered = sorted(self.latencies_ms)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        return {"phase": self.name, "runs": len(ordered), "run_p50_ms": round(statistics.median(ordered), 1),
                "run_p99_ms": round(p99, 1),
                "flood_kib_per_s": round(self.flood_bytes / 1024 / self.flood_s, 1) if self.flood_s else 0.0}


def _worker(stack: PrivateStack, tenant: str, service: str, principal: str, log: Path,
            *args: str) -> subprocess.Popen:
    settings = stack.settings(topic_prefix=tenant_prefix(tenant), partitions=PARTITIONS)
    env = {**os.environ, **stack.env(principal), "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix,
           "AGENTSTREAM_PARTITIONS": str(PARTITIONS)}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "agentstream.cli", "worker", service, *args], env=env,
                                stdout=out, stderr=subprocess.STDOUT)


async def _flood(stack: PrivateStack, stop: asyncio.Event, producers: int, record: bytes) -> int:
    """Junk to partition 0 of beta's intake, as fast as ``producers`` producers go, until ``stop``."""
    topic = Topics(tenant_prefix(BETA), partitions=PARTITIONS).tasks
    written = 0

    async def one() -> None:
        nonlocal written
        out = AIOKafkaProducer(**kafka_options(stack.bootstrap, stack.auth(tenant_principal(BETA))), acks="all",
                               max_batch_size=4 * len(record), linger_ms=5)
        await out.start()
        try:
            pending = []
            while not stop.is_set():
                pending.append(await out.send(topic, record, partition=0))
                written += len(record)
                if len(pending) > 64:
                    await asyncio.gather(*pending)
                    pending.clear()
            await asyncio.gather(*pending, return_exceptions=True)
        finally:
            await out.stop()

    await asyncio.gather(*(one() for _ in range(producers)))
    return written


async def _phase(name: str, stack: PrivateStack, client: AgentClient, runs: int, flood: bool, producers: int,
                 record: bytes) -> Phase:
    stop = asyncio.Event()
    flooding = asyncio.create_task(_flood(stack, stop, producers, record)) if flood else None
    started = time.monotonic()
    if flooding is not None:
        await asyncio.sleep(2)  # the flood at its pace (past the broker's first burst) before measuring
    latencies = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run_id = await client.submit("What is 2 * 3?", tools=["calculator"], max_steps=4, prefetch=False)
        result = await client.wait(run_id, timeout=300)
        if not result.ok:
            raise RuntimeError(f"acme's run failed: {result.error_code}: {result.error}")
        latencies.append((time.perf_counter() - t0) * 1000)
    stop.set()
    written = await flooding if flooding is not None else 0
    return Phase(name, latencies, written, time.monotonic() - started if flood else 0.0)


async def main(runs: int, rate: int, producers: int, record_kb: int, rounds: int = 1) -> list[dict]:
    record = b"\xff" * (record_kb * 1024)
    quota = {tenant_principal(BETA): TenantKafkaQuota(producer_byte_rate=rate)}
    with tempfile.TemporaryDirectory(prefix="tenant-flood-") as tmp:
        directory = Path(tmp)
        stack = PrivateStack(directory / "state", secure=True, tenants=(ACME, BETA),
                             tenant_quotas={t: TenantKafkaQuota(producer_byte_rate=rate) for t in (ACME, BETA)})
        await stack.start()
        procs: list[subprocess.Popen] = []
        try:
            for tenant in (ACME, BETA):
                await stack.grant(Topics(tenant_prefix(tenant), partitions=PARTITIONS), client=tenant_principal(tenant))
            procs += [_worker(stack, ACME, "planner", "planner", directory / "acme-planner.log"),
                      _worker(stack, ACME, "inference", "inference", directory / "acme-inference.log"),
                      _worker(stack, ACME, "tools", "tools", directory / "acme-tools.log"),
                      _worker(stack, BETA, "planner", "planner", directory / "beta-planner.log")]
            acme_settings = stack.settings(topic_prefix=tenant_prefix(ACME), principal=tenant_principal(ACME),
                                           database_login=tenant_principal(ACME), partitions=PARTITIONS)
            async with AgentClient(acme_settings) as client:
                catalog = ToolCatalog.for_runtime(client.runtime, ttl_s=0.0)
                try:
                    deadline = time.monotonic() + 120
                    while "calculator" not in await catalog.refresh():
                        if time.monotonic() > deadline:
                            raise TimeoutError("acme's tools did not register")
                        await asyncio.sleep(0.2)
                finally:
                    await catalog.close()
                await _phase("warm-up", stack, client, 20, False, producers, record)
                phases: list[Phase] = []
                for _ in range(rounds):  # alternated, so that a busier minute does not favour one phase
                    await apply_client_quotas(stack.bootstrap, stack.auth(ADMIN), quota)
                    phases += [await _phase("quiet", stack, client, runs, False, producers, record),
                               await _phase("flood, quota", stack, client, runs, True, producers, record)]
                    await apply_client_quotas(stack.bootstrap, stack.auth(ADMIN),
                                              {tenant_principal(BETA): TenantKafkaQuota(producer_byte_rate=None)})
                    phases.append(await _phase("flood, no quota", stack, client, runs, True, producers, record))
                    await asyncio.sleep(12)  # the broker's quota windows forget the flood
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
                if proc.poll() is None:
                    proc.kill()
            await stack.close()
    merged: dict[str, Phase] = {}
    for p in phases:
        into = merged.setdefault(p.name, Phase(p.name, [], 0, 0.0))
        into.latencies_ms += p.latencies_ms
        into.flood_bytes += p.flood_bytes
        into.flood_s += p.flood_s
    return [p.summary() for p in merged.values()]


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="acme's runs per phase (one at a time)")
    parser.add_argument("--rate", type=int, default=TenantKafkaQuota().producer_byte_rate,
                        help="each tenant's producer_byte_rate (bytes/s)")
    parser.add_argument("--producers", type=int, default=2, help="beta's flooding producers")
    parser.add_argument("--record-kb", type=int, default=64, help="size of a junk record (KiB)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times the three phases are run, alternated; each phase's runs pooled")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    rows = asyncio.run(main(args.runs, args.rate, args.producers, args.record_kb, args.rounds))
    if args.json:
        print(json.dumps({"rate": args.rate, "phases": rows}))
        return
    print(f"{'phase':<18}{'runs':>6}{'p50 ms':>10}{'p99 ms':>10}{'flood KiB/s':>14}")
    for row in rows:
        print(f"{row['phase']:<18}{row['runs']:>6}{row['run_p50_ms']:>10}{row['run_p99_ms']:>10}"
              f"{row['flood_kib_per_s']:>14}")


if __name__ == "__main__":
    cli()
