"""Broker failure under load on a three-node Kafka cluster: how long progress stalls, and that nothing
is lost or done twice.

Starts its own cluster and database (``PrivateStack(brokers=3)``: three KRaft nodes, each broker and
controller; every topic with 3 replicas and ``min.insync.replicas=2``), the workers as processes (two
planners, two tool workers, inference with the scripted model, retrieval), and keeps ``--in-flight``
runs going (each: a model step, two side-effect tool calls, an answer). Then, with runs in flight:

1. ``kill``: SIGKILL one node (``--victim``, default 2; no clean shutdown), wait ``--down-s``, start
   it again on its data and wait until every partition is fully replicated again;
2. ``freeze``: SIGSTOP the same node for ``--down-s``, then SIGCONT: a hung host or a network
   partition, where connections stay open and nothing answers (no reset tells a client to move on);
3. ``restart-N``: a rolling restart, node 1, 2, 3 in turn: a clean shutdown (SIGTERM, which hands
   the node's leaderships over first), start, full replication again, then the next.

Per fault, from the fault until 30 s after it (or the next fault), two figures: the longest time in
which no event was consumed in any run (``events.consumed_at``: the whole system stalled), and the
longest any one event waited from being made to being consumed (``produced_at`` → ``consumed_at``:
the stall one run saw, which includes the producer's retries). ``baseline`` is both figures over the
8 s before the first fault. Afterwards every run must have completed
and every tool effect must have happened exactly once (``chaos_effects``: one row per execution, no
unique key) and no event may be recorded twice.

``--broker-config KEY=VALUE`` (repeatable) appends broker properties to every node's configuration,
e.g. Kafka's own defaults to compare against this project's: ``--broker-config
broker.session.timeout.ms=9000 --broker-config broker.heartbeat.interval.ms=2000``.

    .venv/bin/python -m bench.chaos.broker_failure [--in-flight 8] [--victim 2] [--down-s 10] [--faults kill,freeze,rolling]
                                             [--broker-config KEY=VALUE ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from agentstream.devstack.private import PrivateStack
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.masking import mask_url
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from bench.chaos.chaos_faults import fully_replicated
from bench.chaos.chaos_procs import groups_ready, terminate_all
from bench.chaos.chaos_tools import CREATE_EFFECTS_TABLE, EFFECTS_TABLE

#: The repository root: the workers run there, so ``--tools bench.chaos.chaos_tools`` imports.
ROOT = Path(__file__).resolve().parents[2]

TASK = ('[[tool:chaos_effect {"label": "first"}]] [[tool:chaos_effect {"label": "second"}]] '
        '[[answer:done]]')
#: The workers: two of each service that keeps per-run state or effects.
SERVICES = ("planner", "planner", "inference", "tools", "tools", "retrieval")
#: How long after a fault its stall is looked for.
WINDOW_S = 30.0


@dataclass
class Fault:
    name: str
    at: float  # wall clock (time.time())
    ready_s: float = 0.0  # until the node was back and every partition fully replicated
    stall_ms: float = 0.0  # the longest time without any progress
    worst_wait_ms: float = 0.0  # the longest any one event took from being made to being consumed


@dataclass
class Load:
    """``in_flight`` runs at all times until ``stop``; each run's id and result."""

    client: AgentClient
    in_flight: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    run_ids: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    submit_errors: int = 0

    async def driver(self) -> None:
        while not self.stop.is_set():
            try:
                run_id = await self.client.submit(TASK, tools=["chaos_effect"], max_steps=8)
            except Exception:  # a submit during the fault: counted, and tried again (as a client would)
                self.submit_errors += 1
                await asyncio.sleep(0.2)
                continue
            self.run_ids.append(run_id)
            result = await self.client.wait(run_id, timeout=180)
            if not result.ok:
                self.failed.append(f"{run_id}: {result.status} {result.error}")

    async def run(self) -> None:
        await asyncio.gather(*(self.driver() for _ in range(self.in_flight)))


def start_workers(stack: PrivateStack, settings: Settings, logs: Path) -> list[subprocess.Popen]:
    env = {**os.environ, **stack.env(), "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix,
           "AGENTSTREAM_PARTITIONS": str(settings.partitions),
           "AGENTSTREAM_REPLICATION_FACTOR": str(settings.replication_factor),
           "AGENTSTREAM_KAFKA_REQUEST_TIMEOUT_MS": str(settings.kafka_request_timeout_ms),
           "AGENTSTREAM_TRACING": "off", "AGENTSTREAM_METRICS_PORT": "off"}
    procs = []
    for i, service in enumerate(SERVICES):
        argv = [sys.executable, "-m", "agentstream.cli", "worker", service, "--log-level", "WARNING"]
        if service == "tools":
            argv += ["--tools", "agentstream.services.tools.builtin", "--tools", "bench.chaos.chaos_tools"]
        log = open(logs / f"{service}-{i}.log", "ab")
        procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    return procs


async def wait_ready(client: AgentClient, timeout: float = 120) -> None:
    """Until a run with a tool call completes end to end (every group joined, the tool registered)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            run_id = await client.submit("[[tool:chaos_effect {\"label\": \"warm\"}]] [[answer:ok]]",
                                         tools=["chaos_effect"])
            if (await client.wait(run_id, timeout=max(1.0, deadline - time.monotonic()))).ok:
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest stretch within [start, end] without a timestamp (seconds)."""
    inside = [start] + [t for t in times if start < t < end] + [end]
    return max(b - a for a, b in itertools.pairwise(inside))


async def faults(stack: PrivateStack, victim: int, down_s: float, kinds: set[str]) -> list[Fault]:
    done: list[Fault] = []

    async def fault(name: str, act: Callable[[], Awaitable[object]]) -> None:
        """Do one fault, wait until every partition is fully replicated again, then 5 s of calm."""
        record = Fault(name, time.time())
        started = time.monotonic()
        await act()
        await fully_replicated(stack.bootstrap)
        record.ready_s = time.monotonic() - started
        done.append(record)
        await asyncio.sleep(5)

    async def kill() -> None:
        await stack.kill_kafka(victim)
        await asyncio.sleep(down_s)
        await stack.start_kafka()

    async def freeze() -> None:  # a hung host: connections stay open, nothing answers, no reset
        pid = stack.kafka_pid(victim)
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(down_s)
        os.kill(pid, signal.SIGCONT)

    async def restart(node: int) -> None:
        await stack.stop_kafka(node)
        await stack.start_kafka()

    if "kill" in kinds:
        await fault("kill", kill)
    if "freeze" in kinds:
        await fault("freeze", freeze)
    if "rolling" in kinds:
        for node in (1, 2, 3):
            await fault(f"restart-{node}", functools.partial(restart, node))
    return done


async def measure(args: argparse.Namespace, stack: PrivateStack, settings: Settings, logs: Path) -> dict:
    await ensure_topics(settings.kafka_bootstrap, Topics.of(settings).specs(), auth=settings.kafka_auth)  # the client may start first
    async with AgentClient(settings) as client:
        pool = await client.pool()
        await pool.execute(CREATE_EFFECTS_TABLE)
        await wait_ready(client)
        topics = client.topics
        await groups_ready(settings.kafka_bootstrap, {topics.group(s): SERVICES.count(s) for s in set(SERVICES)})
        load = Load(client, args.in_flight)
        loading = asyncio.create_task(load.run())
        await asyncio.sleep(10)  # steady state: the baseline window
        first = time.time()
        done = await faults(stack, args.victim, args.down_s, set(args.faults.split(",")))
        await asyncio.sleep(5)
        load.stop.set()
        await asyncio.wait_for(loading, 240)
        rows = await pool.fetch("SELECT extract(epoch FROM produced_at) AS made, extract(epoch FROM consumed_at) AS t "
                                "FROM events WHERE run_id = ANY($1) AND consumed_at IS NOT NULL", load.run_ids)
        times = sorted(float(r["t"]) for r in rows)
        waits = [(float(r["made"]), float(r["t"]) - float(r["made"])) for r in rows]
        ends = [f.at for f in done[1:]] + [time.time()]
        for fault, end in zip(done, ends, strict=True):
            end = min(end, fault.at + WINDOW_S)
            fault.stall_ms = round(1000 * longest_gap(times, fault.at, end), 1)
            fault.worst_wait_ms = round(1000 * max(w for made, w in waits if fault.at - 1 <= made < end), 1)
        baseline = round(1000 * longest_gap(times, first - 8, first), 1)
        baseline_wait = round(1000 * max(w for made, w in waits if first - 8 <= made and made + w < first), 1)
        effects = await pool.fetch(f"SELECT run_id, step_id, count(*) AS n FROM {EFFECTS_TABLE} "
                                   "WHERE run_id = ANY($1) GROUP BY run_id, step_id", load.run_ids)
        twice_events = await pool.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM events WHERE run_id = ANY($1) "
            "GROUP BY run_id, step_id, event_type HAVING count(*) > 1) d", load.run_ids)
    runs = len(load.run_ids)
    return {
        "brokers": 3, "in_flight": args.in_flight, "runs": runs, "failed": len(load.failed),
        "failures": load.failed[:5], "submit_errors": load.submit_errors,
        "effects": sum(r["n"] for r in effects), "effects_expected": 2 * runs,
        "effects_twice": sum(1 for r in effects if r["n"] > 1), "events_twice": twice_events,
        "baseline_gap_ms": baseline, "baseline_worst_wait_ms": baseline_wait,
        "request_timeout_ms": settings.kafka_request_timeout_ms, "broker_config": dict(kv.split("=", 1) for kv in args.broker_config),
        "faults": [{"name": f.name, "stall_ms": f.stall_ms, "worst_wait_ms": f.worst_wait_ms,
                    "ready_s": round(f.ready_s, 1)} for f in done],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--in-flight", type=int, default=8, help="runs kept in flight")
    parser.add_argument("--victim", type=int, default=2, choices=[1, 2, 3], help="the node SIGKILLed")
    parser.add_argument("--down-s", type=float, default=10.0, help="how long the killed node stays down")
    parser.add_argument("--faults", default="kill,freeze,rolling",
                        help="which faults, in this order: kill (SIGKILL), freeze (SIGSTOP for --down-s: a hung "
                             "host), rolling (a clean restart of each node in turn)")
    parser.add_argument("--broker-config", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker property for every node (repeatable)")
    parser.add_argument("--request-timeout-ms", type=int, default=10_000,
                        help="the clients' Kafka request timeout (AGENTSTREAM_KAFKA_REQUEST_TIMEOUT_MS)")
    parser.add_argument("--keep-on-failure", action="store_true",
                        help="when a run does not finish, leave the stack and workers running to look at")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # "Unable connect" to the dead node, many times a second
    overrides = dict(kv.split("=", 1) for kv in args.broker_config)
    work = Path(tempfile.mkdtemp(prefix="agentstream-broker-failure-"))
    stack = PrivateStack(work / "state", brokers=3, broker_overrides=overrides)
    asyncio.run(stack.start())
    settings = dataclasses.replace(stack.settings(topic_prefix="bf.", partitions=8),
                                   kafka_request_timeout_ms=args.request_timeout_ms)
    procs = start_workers(stack, settings, work)

    def clean_up() -> None:
        terminate_all(procs)
        asyncio.run(stack.close())

    try:
        report = asyncio.run(measure(args, stack, settings, work))
    except BaseException:
        if args.keep_on_failure:
            print(f"left running: KAFKA_BOOTSTRAP_SERVERS={stack.bootstrap} DATABASE_URL={mask_url(stack.database_url)}; "
                  f"logs in {work}; workers {[p.pid for p in procs]}", flush=True)
        else:
            clean_up()
        raise
    clean_up()
    shutil.rmtree(work, ignore_errors=True)
    print(f"{report['runs']} runs ({report['in_flight']} in flight), {report['failed']} failed, "
          f"effects {report['effects']}/{report['effects_expected']} ({report['effects_twice']} twice), "
          f"events recorded twice: {report['events_twice']}, submit errors: {report['submit_errors']}")
    print(f"  baseline: longest gap without progress {report['baseline_gap_ms']:>8} ms; "
          f"longest wait of one event {report['baseline_worst_wait_ms']:>8} ms")
    for f in report["faults"]:
        print(f"{f['name']:>10}: longest gap without progress {f['stall_ms']:>8} ms; longest wait of one event "
              f"{f['worst_wait_ms']:>8} ms; back and fully replicated after {f['ready_s']} s")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
