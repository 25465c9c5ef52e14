"""What distance costs: the same agent run with its parts on separate hosts, at 0 to 150 ms apart.

Builds test hosts from network namespaces on this machine (``bench/netsim/testnet.py``: one namespace per
host, each with one interface whose packets pass through a link emulator that delays, jitters and
drops them like ``tc netem``, which this machine's kernel lacks) and puts one part on each:

    kafka       the brokers (``--brokers``, default 3: every topic 3 replicas, min.insync.replicas 2)
    postgres    PostgreSQL (the run history)
    planner     two planner processes
    inference   the inference service (the scripted model with a fixed latency, ``[[slow:MS]]``)
    tools       the tool and retrieval services
    client      the process that submits runs and reads their outcomes and tokens

Then, per placement, it sets the delays (a host "80 ms away" sends every packet 80 ms late, so each
round trip to it takes 80 ms more), runs ``--runs`` runs one at a time (each: a model step, a
calculator call, a model step that answers; the model takes ``--model-ms`` per reply), and reports:

- ``run_p50_ms`` / ``run_p99_ms``: submit → outcome, as the client sees it;
- ``ttft_p50_ms``: submit → the run's first token at the client (a long-lived consumer of the token
  topic, as a streaming gateway would keep);
- ``transport_share``: of each run's wall time (``runs.submitted_at`` → ``finished_at``), the share
  spent in Kafka hops and queues, from the events' own timestamps (``agentstream replay show``'s budget:
  ``streams/replay/timeline.py``), with ``compute_share`` (model and tool) and ``planner_share``
  (transitions, the PostgreSQL commit, publishing) beside it.

``--json`` prints one JSON object last with a ``placements`` list (``name``, ``rtt_ms``, ``run_p50_ms``,
``ttft_p50_ms``, ``transport_share``, and the rest). Needs root (namespaces); about 2 minutes set-up,
then ``--runs`` times a few seconds per placement.

``--model cpu``: the same with SmolLM2-135M on llama.cpp as the model (a real model's compute, on this
machine's two cores), on the placements where its seconds meet the network's milliseconds.

    sudo .venv/bin/python -m bench.netsim.regions [--quick] [--runs 20] [--model scripted|cpu] [--model-ms 100] [--brokers 3]
                                           [--placements one-host,inference-80,...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.devstack import process
from agentstream.devstack.kafka import KafkaCluster, KafkaLauncher
from agentstream.devstack.postgres import PostgresLauncher, default_work_dir
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import DEFAULT_DATABASE, StackPaths
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.replay import timeline
from agentstream.streams.replay.records import Budget
from agentstream.streams.store import migrations
from bench.chaos.chaos_procs import groups_ready, terminate_all
from bench.netsim.testnet import TestNetwork, available

#: The repository root: every process this starts runs there (``python -m bench.netsim.regions``).
ROOT = Path(__file__).resolve().parents[2]

HOSTS = ["kafka", "postgres", "planner", "inference", "tools", "client"]
#: host → the services it runs (one process each).
WORKERS = {"planner": ["planner", "planner"], "inference": ["inference"], "tools": ["tools", "retrieval"]}
KAFKA_PORT, PG_PORT = 9092, 5432


@dataclass(frozen=True)
class Shape:
    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0


@dataclass(frozen=True)
class Placement:
    """Which hosts are far, and how far: each named host's packets leave ``delay_ms`` late."""

    name: str
    rtt_ms: float
    shapes: dict[str, Shape] = field(default_factory=dict)
    about: str = ""


def _all(delay: float) -> dict[str, Shape]:
    return {h: Shape(delay) for h in HOSTS}


PLACEMENTS = [
    Placement("one-host", 0, {}, "every part on its own host, no delay between them (loopback speed)"),
    Placement("one-zone", 1, _all(0.5), "every host 1 ms from every other: one data centre"),
    Placement("inference-20", 20, {"inference": Shape(20)}, "the model 20 ms away: a nearby zone"),
    Placement("inference-80", 80, {"inference": Shape(80)}, "the model in another region"),
    Placement("inference-150", 150, {"inference": Shape(150)}, "the model on another continent"),
    Placement("inference-80-lossy", 80, {"inference": Shape(80, 10, 1.0)}, "80 ms ± 10 ms, 1 % loss"),
    Placement("client-80", 80, {"client": Shape(80)}, "the user in another region"),
    Placement("client-150", 150, {"client": Shape(150)}, "the user on another continent"),
    Placement("tools-80", 80, {"tools": Shape(80)}, "tools and retrieval in another region"),
    Placement("planner-20", 20, {"planner": Shape(20)}, "the planner 20 ms from the broker and database"),
    Placement("postgres-20", 20, {"postgres": Shape(20)}, "the database 20 ms from the planner"),
]
QUICK = ["one-host", "one-zone", "inference-80", "client-80", "planner-20"]
#: The CPU model takes seconds per run: the placements where its time meets the network's.
CPU_PLACEMENTS = ["one-host", "inference-20", "inference-80", "inference-150"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# -- servers on their hosts ------------------------------------------------------------------------

def serve(what: str, host: str, work: Path, brokers: int) -> None:
    """Runs inside a host's namespace: start a server there (it outlives this process, keeping the
    namespace), print its processes as JSON."""
    paths = StackPaths.from_env()
    if what == "kafka":
        cluster = KafkaCluster(infra_dir=paths.infra_dir, cache_dir=paths.cache_dir, work_dir=work / "kafka",
                               port=KAFKA_PORT, size=brokers, host=host)
        refs = cluster.start(timeout=180)
        print(json.dumps({"bootstrap": cluster.bootstrap, "pids": [r.pid for r in refs.values()]}))
    else:
        run_as = process.RunAs.for_postgres()
        pg = PostgresLauncher(infra_dir=paths.infra_dir, work_dir=default_work_dir(work, run_as), port=PG_PORT,
                              database=DEFAULT_DATABASE, run_as=run_as, host=host)
        ref = pg.start()
        print(json.dumps({"url": pg.url, "pids": [ref.pid], "work_dir": str(pg.work_dir)}))


def start_server(net: TestNetwork, what: str, work: Path, brokers: int) -> dict:
    """Start a server on its host. Kafka's jars are resolved out here first: a test host has no route
    to Maven Central."""
    if what == "kafka":
        paths = StackPaths.from_env()
        KafkaLauncher(infra_dir=paths.infra_dir, cache_dir=paths.cache_dir, work_dir=work / "kafka",
                      port=KAFKA_PORT, controller_port=KAFKA_PORT + 1).ensure_jars()
    argv = [*net.exec_argv(what), sys.executable, "-m", "bench.netsim.regions", "--serve", what,
            "--host", net.hosts[what], "--work", str(work), "--brokers", str(brokers)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"starting {what} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def start_workers(net: TestNetwork, settings: Settings, logs: Path, model: str) -> list[subprocess.Popen]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url,
           "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix, "AGENTSTREAM_PARTITIONS": str(settings.partitions),
           "AGENTSTREAM_REPLICATION_FACTOR": str(settings.replication_factor),
           "AGENTSTREAM_TRACING": "off", "AGENTSTREAM_METRICS_PORT": "off"}
    procs = []
    for host, services in WORKERS.items():
        for i, service in enumerate(services):
            argv = [*net.exec_argv(host), sys.executable, "-m", "agentstream.cli", "worker", service,
                    "--log-level", "WARNING"]
            if service == "inference" and model == "cpu":
                argv += ["--backend", "llamacpp"]
            log = open(logs / f"{service}-{i}.log", "ab")
            procs.append(subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    return procs


# -- the client, on its host -------------------------------------------------------------------------

def task_for(model: str, model_ms: int) -> str:
    if model == "cpu":
        return "What is 17 * 23? Use the calculator."
    return f'[[slow:{model_ms}]] [[tool:calculator {{"expression": "6 * 7"}}]] [[answer:42]]'


async def client_runs(settings: Settings, runs: int, task: str) -> list[dict]:
    """Runs inside the client's namespace: ``runs`` runs one at a time; per run its id, latency and
    time to first token."""
    topics = Topics.of(settings)
    first_token: dict[str, float] = {}
    tokens = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                              isolation_level="read_committed", fetch_max_wait_ms=50)
    await tokens.start()
    tps = [TopicPartition(topics.tokens, p) for p in range(settings.partitions)]
    tokens.assign(tps)
    await tokens.seek_to_end(*tps)

    async def follow() -> None:
        while True:
            batch = await tokens.getmany(timeout_ms=100)
            now = time.monotonic()
            for records in batch.values():
                for msg in records:
                    if msg.key is not None:
                        first_token.setdefault(msg.key.decode(), now)

    follower = asyncio.create_task(follow())
    out = []
    try:
        async with AgentClient(settings) as client:
            await client.watch_outcomes()
            for i in range(runs + 1):  # the first warms this client's connections up: not reported
                started = time.monotonic()
                run_id = await client.submit(task, tools=["calculator"], max_steps=6)
                result = await client.wait(run_id, timeout=120)
                ended = time.monotonic()
                await asyncio.sleep(0.2)  # the last tokens' fetch
                ttft = first_token.get(run_id)
                if i == 0:
                    continue
                out.append({"run_id": run_id, "ok": result.ok, "run_ms": 1000 * (ended - started),
                            "ttft_ms": 1000 * (ttft - started) if ttft is not None else None})
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        await tokens.stop()
    return out


def run_client(net: TestNetwork, settings: Settings, runs: int, task: str) -> list[dict]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url,
           "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix, "AGENTSTREAM_PARTITIONS": str(settings.partitions),
           "AGENTSTREAM_TRACING": "off"}
    argv = [*net.exec_argv("client"), sys.executable, "-m", "bench.netsim.regions", "--client",
            "--runs", str(runs), "--task", task]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120 + runs * 120)
    if done.returncode != 0:
        raise RuntimeError(f"the client failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- measuring ------------------------------------------------------------------------------------------

async def budgets(settings: Settings, run_ids: list[str]) -> list[Budget]:
    import asyncpg

    conn = await asyncpg.connect(settings.database_url)
    try:
        found = [await timeline.load(conn, r) for r in run_ids]
    finally:
        await conn.close()
    return [t.budget() for t in found if t is not None]


def report(placement: Placement, runs: list[dict], spent: list[Budget]) -> dict:
    ok = [r for r in runs if r["ok"]]
    latencies = [r["run_ms"] for r in ok]
    ttfts = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None]

    def share(part: str) -> float:
        values = [getattr(b, f"{part}_ms") / b.wall_ms for b in spent if b.wall_ms > 0]
        return round(statistics.median(values), 3) if values else 0.0

    return {"name": placement.name, "rtt_ms": placement.rtt_ms, "about": placement.about,
            "runs": len(runs), "failed": len(runs) - len(ok),
            "run_p50_ms": round(percentile(latencies, 50), 1) if latencies else None,
            "run_p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
            "ttft_p50_ms": round(percentile(ttfts, 50), 1) if ttfts else None,
            "transport_share": share("transport"), "compute_share": share("compute"),
            "planner_share": share("planner"),
            "wall_p50_ms": round(statistics.median(b.wall_ms for b in spent), 1) if spent else None}


def measure(net: TestNetwork, settings: Settings, placements: list[Placement], runs: int, task: str) -> list[dict]:
    results = []
    run_client(net, settings, 10, task)  # warm-up: the brokers' JIT, the workers' caches, the model's first prompt
    for placement in placements:
        for host in HOSTS:
            shape = placement.shapes.get(host, Shape(0))
            net.shape(host, shape.delay_ms, shape.jitter_ms, shape.loss_pct)
        time.sleep(1)
        measured = run_client(net, settings, runs, task)
        for host in HOSTS:
            net.shape(host)
        spent = asyncio.run(budgets(settings, [r["run_id"] for r in measured if r["ok"]]))
        results.append(report(placement, measured, spent))
        row = results[-1]
        print(f"{row['name']:>20} rtt {row['rtt_ms']:>5} ms: run p50 {row['run_p50_ms']} ms, p99 "
              f"{row['run_p99_ms']} ms, first token p50 {row['ttft_p50_ms']} ms, transport "
              f"{row['transport_share']:.0%}, compute {row['compute_share']:.0%}, planner "
              f"{row['planner_share']:.0%}", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}; 5 runs each")
    parser.add_argument("--runs", type=int, default=20, help="runs per placement, one at a time")
    parser.add_argument("--model", choices=["scripted", "cpu"], default="scripted",
                        help="the scripted model with a fixed latency, or SmolLM2-135M on llama.cpp (CPU)")
    parser.add_argument("--model-ms", type=int, default=100, help="the scripted model's time per reply")
    parser.add_argument("--brokers", type=int, default=3, choices=[1, 3])
    parser.add_argument("--placements", default="", help="comma-separated names (default: all)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--serve", choices=["kafka", "postgres"], help=argparse.SUPPRESS)
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task", help=argparse.SUPPRESS)
    parser.add_argument("--host", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    if args.serve:
        serve(args.serve, args.host, args.work, args.brokers)
        return
    if args.client:
        print(json.dumps(asyncio.run(client_runs(Settings.load(), args.runs, args.task))))
        return
    why = available()
    if why is not None:
        sys.exit(f"regions: {why} (needs root: network namespaces and TUN devices)")
    names = args.placements.split(",") if args.placements else QUICK if args.quick else [p.name for p in PLACEMENTS]
    placements = [p for name in names for p in PLACEMENTS if p.name == name]
    runs = 5 if args.quick and args.runs == 20 else args.runs
    if args.model == "cpu" and not args.placements:
        placements = [p for p in PLACEMENTS if p.name in CPU_PLACEMENTS]
    work = Path(tempfile.mkdtemp(prefix="agentstream-regions-"))
    net = TestNetwork(HOSTS).up()
    pids: list[int] = []
    procs: list[subprocess.Popen] = []
    postgres: dict = {}
    try:
        kafka = start_server(net, "kafka", work, args.brokers)
        postgres = start_server(net, "postgres", work, args.brokers)
        pids += kafka["pids"] + postgres["pids"]
        settings = Settings(kafka_bootstrap=kafka["bootstrap"], database_url=postgres["url"], external_kafka=True,
                            external_database=True, topic_prefix="regions.", partitions=8,
                            replication_factor=args.brokers)
        topics = Topics.of(settings)

        async def prepare() -> None:
            await migrations.migrate(settings.database_url)
            await ensure_topics(settings.kafka_bootstrap, topics.specs(), auth=settings.kafka_auth)

        asyncio.run(prepare())
        procs = start_workers(net, settings, work, args.model)
        expected = {topics.group(s): n for s, n in {"planner": 2, "inference": 1, "tools": 1, "retrieval": 1}.items()}
        asyncio.run(groups_ready(settings.kafka_bootstrap, expected))
        results = measure(net, settings, placements, runs, task_for(args.model, args.model_ms))
    finally:
        terminate_all(procs)
        for pid in pids:
            with contextlib.suppress(Exception):
                ref = process.ProcessRef.of(pid)
                process.stop(ref, grace=30)
        net.down()
        shutil.rmtree(work, ignore_errors=True)
        if postgres.get("work_dir"):
            shutil.rmtree(postgres["work_dir"], ignore_errors=True)  # under /var/tmp when run as root
    print(f"{'placement':>20} {'rtt ms':>7} {'run p50':>9} {'run p99':>9} {'ttft p50':>9} {'transport':>10} "
          f"{'compute':>8} {'planner':>8}")
    for row in results:
        print(f"{row['name']:>20} {row['rtt_ms']:>7} {row['run_p50_ms']:>9} {row['run_p99_ms']:>9} "
              f"{row['ttft_p50_ms']!s:>9} {row['transport_share']:>10.0%} {row['compute_share']:>8.0%} "
              f"{row['planner_share']:>8.0%}")
    if args.json:
        print(json.dumps({"brokers": args.brokers, "runs_per_placement": runs, "model": args.model,
                          "model_ms": args.model_ms if args.model == "scripted" else None,
                          "placements": results}))


if __name__ == "__main__":
    main()
