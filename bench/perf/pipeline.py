"""Pipeline throughput and per-hop latency: N runs of 3 steps (model → calculator → model answer).

The model is the zero-latency scripted backend, so what is measured is agentstream itself: Kafka hops,
PostgreSQL history, the planner, the runtime. Runs are submitted without the speculative retrieval
(``prefetch=False``): its cost depends on what the stack's ``default`` collection holds (nothing: an
error result at once; documents, as after ``make demo``: an embedding and a search per run), and
bench/perf/prefetch.py measures it. Workers run as separate processes (`agentstream worker
...`, on their own topic prefix) on the stack `agentstream dev up` started (started here if needed).

Each concurrency in ``--concurrency`` (default ``1,50``) is measured in turn on the same workers: 300
runs one at a time (``--sequential-runs``), 1,000 (``--runs``) at each higher concurrency. Reports, per
concurrency:
- steps/s: completed steps over the wall time from the first submit to the last outcome;
- run latency p50/p99 (submit → outcome, as the client sees it), and CPU per step of the workers, the
  broker and PostgreSQL (its backends included), from /proc;
- per-hop latency p50/p99: for every event a service consumed, from the Kafka record's timestamp
  (stamped by the producer when it sends the event) to the moment the next service took it
  (both recorded in PostgreSQL); also shown, from the event's own created_at (which for the
  planner's requests is the start of the transition, so it includes the history write);
- overhead per step: run p50 / 3 minus the time per step of the same agent loop (planner state machine,
  scripted model, calculator) run in-process without Kafka or PostgreSQL.
``--json``'s last line has the issue-15 figures at the top (``overhead_per_step_ms`` and ``hop_p50_ms``
of the lowest concurrency; ``steps_per_s``, ``run_p99_ms`` and ``cpu_ms_per_step`` of the highest), each
level's in ``levels``, and the earlier keys. ``--breakdown``: the time of every stage of every record,
per process (``streams/telemetry/stages.py``), summed per step, and CPU per process.

Telemetry (``--telemetry on``, the default): every worker serves Prometheus metrics (its own port,
scraped every 5 s by this script, as Prometheus would) and traces every run (``--trace-sample``, default
1.0: every step is a span) to a JSON-lines file (``--trace-mode file``) or OTLP (``otlp``, to
``OTEL_EXPORTER_OTLP_ENDPOINT``); the submitting client starts each run's root span. ``--telemetry off``:
no metrics endpoint and no spans (the traceparent header is still carried).

``--workload conversations``: every run a turn of a session with two parallel calls (bench/perf/workloads.py).

    .venv/bin/python -m bench.perf.pipeline [--concurrency 1,50] [--runs 1000] [--sequential-runs 300]
                                       [--workload plain|conversations]
                                       [--layout split] [--telemetry on|off|metrics|tracing] [--trace-mode file|otlp]
                                       [--trace-sample 1.0] [--breakdown] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp
import asyncpg

from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.telemetry import stages
from agentstream.streams.telemetry import tracing as telemetry_tracing
from agentstream.streams.telemetry.discovery import discover
from agentstream.streams.telemetry.tracing import Tracing
from bench.perf.bench_stacks import dev_stack, secure_stack
from bench.perf.proc_cpu import cpu_seconds
from bench.perf.scripted_agent import run_agent
from bench.perf.workloads import WORKLOADS, Workload

ROOT = Path(__file__).resolve().parents[2]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def in_process_steps_per_s(runs: int) -> float:
    """The same loop without Kafka or PostgreSQL: state machine + scripted model + calculator."""
    topics = Topics()
    t0 = time.perf_counter()
    steps = sum(run_agent(i, topics=topics) for i in range(runs))
    return steps / (time.perf_counter() - t0)


async def submit_all(client: AgentClient, count: int, concurrency: int, offset: int,
                     run_ms: list[float] | None = None,
                     submit_ms: list[float] | None = None, workload: Workload = WORKLOADS["plain"]) -> tuple[list[str], float]:
    """``count`` runs, ``concurrency`` at a time; each run's latency (submit → outcome) into ``run_ms``
    and each submit's (validated, produced, acknowledged) into ``submit_ms``."""
    semaphore = asyncio.Semaphore(concurrency)
    run_ids: list[str] = []

    async def one(i: int) -> None:
        async with semaphore:
            t0 = time.perf_counter()
            run_id = await workload.submit(client, i, concurrency)
            t1 = time.perf_counter()
            run_ids.append(run_id)
            result = await client.wait(run_id, timeout=300)
            if run_ms is not None:
                run_ms.append((time.perf_counter() - t0) * 1000)
            if submit_ms is not None:
                submit_ms.append((t1 - t0) * 1000)
            if not result.ok or result.steps != workload.steps:
                raise RuntimeError(f"run {run_id} did not take the {workload.steps} expected steps: {result}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(offset + i) for i in range(count)))
    return run_ids, time.perf_counter() - t0


async def scrape_metrics(settings: Settings, stop: asyncio.Event, interval_s: float = 5.0) -> int:
    """What Prometheus would do: scrape every registered worker every ``interval_s``; returns scrapes."""
    scrapes = 0
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            for url, _ in await discover(settings.database_url, settings.topic_prefix):
                async with session.get(url) as response:
                    await response.read()
                    scrapes += response.status == 200
            try:
                await asyncio.wait_for(stop.wait(), interval_s)
            except TimeoutError:
                pass
    return scrapes


def cpu_by_process(processes: dict[str, list[int]]) -> dict[str, float]:
    return {name: cpu_seconds(pids, children=name == "postgres") if name != "client"
            else sum(os.times()[:2]) for name, pids in processes.items()}


@dataclass
class Level:
    """One measured concurrency: its runs and what they took."""

    concurrency: int
    runs: int
    run_ids: list[str]
    wall_s: float
    run_ms: list[float]
    submit_ms: list[float]
    cpu_s: dict[str, float]
    window: tuple[float, float]
    hops: list[float] = field(default_factory=list)
    made_to_consumed: list[float] = field(default_factory=list)
    by_type: dict[str, list[float]] = field(default_factory=dict)
    steps_per_run: int = 3

    @property
    def steps(self) -> int:
        return self.steps_per_run * self.runs

    def cpu_ms_per_step(self, names: tuple[str, ...] = ("planner", "inference", "tools", "retrieval", "all",
                                                         "broker", "postgres")) -> float:
        return 1000 * sum(v for k, v in self.cpu_s.items() if k in names) / self.steps


async def measure(settings: Settings, levels: list[tuple[int, int]], telemetry: bool = False,
                  processes: dict[str, list[int]] | None = None,
                  workload: Workload = WORKLOADS["plain"], owner_url: str | None = None) -> tuple[list[Level], float, int]:
    """Each (concurrency, runs) level in turn after a warm-up; also the old 20-run unloaded step time.
    The events history is read back as ``owner_url`` (a tenant's own login may not read it)."""
    processes = processes or {}
    stop_scraping = asyncio.Event()
    scraper = asyncio.create_task(scrape_metrics(settings, stop_scraping)) if telemetry else None
    measured: list[Level] = []
    async with AgentClient(settings) as client:
        await client.watch_outcomes()
        # Warm-up at the highest concurrency: connections, statement plans, and the broker's JIT
        # (a freshly started JVM is several times slower for its first tens of seconds).
        top = max(c for c, _ in levels)
        await submit_all(client, max(300, max(r for _, r in levels) // 4), top, 0, workload=workload)
        sequential: list[float] = []
        for i in range(20):
            t0 = time.perf_counter()
            run_id = await client.submit(f"What is {i} * 2?", tools=["calculator"], max_steps=5, prefetch=False)
            await client.wait(run_id, timeout=60)
            sequential.append((time.perf_counter() - t0) * 1000 / 3)
        for n, (concurrency, runs) in enumerate(levels):
            run_ms: list[float] = []
            submit_ms: list[float] = []
            cpu0 = cpu_by_process(processes)
            start = time.time()
            run_ids, wall = await submit_all(client, runs, concurrency, 100_000 * (n + 1), run_ms, submit_ms, workload)
            end = time.time()
            cpu1 = cpu_by_process(processes)
            measured.append(Level(concurrency, runs, run_ids, wall, run_ms, submit_ms,
                                  {k: cpu1[k] - cpu0[k] for k in cpu0}, (start, end), steps_per_run=workload.steps))
    scrapes = 0
    if scraper is not None:
        stop_scraping.set()
        scrapes = await scraper
    conn = await asyncpg.connect(owner_url or settings.database_url)
    try:
        for level in measured:
            rows = await conn.fetch(
                """SELECT event_type, extract(epoch FROM consumed_at - appended_at) * 1000 AS hop,
                          extract(epoch FROM consumed_at - produced_at) * 1000 AS made
                   FROM events WHERE run_id = ANY($1) AND consumed_at IS NOT NULL""", level.run_ids)
            for r in rows:
                level.by_type.setdefault(r["event_type"], []).append(float(r["hop"]))
            level.hops = [float(r["hop"]) for r in rows]
            level.made_to_consumed = [float(r["made"]) for r in rows]
    finally:
        await conn.close()
    return measured, statistics.median(sequential), scrapes


def telemetry_env(mode: str, trace_mode: str, sample: float, trace_file: Path) -> dict[str, str]:
    """The workers' telemetry settings: metrics on a port of each one's own, and/or tracing; or nothing."""
    env = {"AGENTSTREAM_TRACING": "off", "AGENTSTREAM_METRICS_PORT": "off"}
    if mode in ("on", "metrics"):
        env.update({"AGENTSTREAM_METRICS_PORT": "0", "AGENTSTREAM_METRICS_HOST": "127.0.0.1"})
    if mode in ("on", "tracing"):
        env.update({"AGENTSTREAM_TRACING": trace_mode, "AGENTSTREAM_TRACE_FILE": str(trace_file),
                    "AGENTSTREAM_TRACE_SAMPLE": str(sample)})
    return env


def start_workers(settings: Settings, layout: str, log_dir: Path, extra_env: dict[str, str] | None = None,
                  connection_env: Callable[[str], dict[str, str]] | None = None) -> list[subprocess.Popen]:
    """The workers of ``layout``; ``connection_env(service)``: how that service connects (its own principal
    and login on the secure stack), else the settings' bootstrap servers and database URL."""
    base = {**os.environ, "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix,
            "AGENTSTREAM_PARTITIONS": str(settings.partitions), **(extra_env or {})}
    groups = {"single": [["all"]], "split": [["planner"], ["inference"], ["tools"], ["retrieval"]],
              "split2": [["planner"], ["planner"], ["inference"], ["tools"], ["retrieval"]]}[layout]
    procs = []
    for group in groups:
        log = open(log_dir / f"worker-{group[0]}.log", "ab")
        connection = connection_env(group[0]) if connection_env is not None else {
            "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url}
        procs.append(subprocess.Popen([sys.executable, "-m", "agentstream.cli", "worker", *group, "--log-level", "WARNING"],
                                      env={**base, **connection}, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    return procs


async def wait_ready(settings: Settings, timeout: float = 60) -> None:
    """Until a run completes end to end (every group joined, tools registered). The topics are created
    here first: the client refuses to start on a broker that lacks them, and the workers, started a
    moment ago, may not have made them yet (the benchmark exited before its report when they had not)."""
    deadline = time.monotonic() + timeout
    if not settings.kafka_auth.sasl:  # on the secure stack the administrator made them (bench_stacks.py)
        await ensure_topics(settings.kafka_bootstrap, Topics.of(settings).specs(), auth=settings.kafka_auth)
    async with AgentClient(settings) as client:
        while True:
            try:
                run_id = await client.submit("What is 1 + 1?", tools=["calculator"])
                await client.wait(run_id, timeout=max(1.0, deadline - time.monotonic()))
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)


#: The stages of a record in the order they happen, with what each means (``streams/telemetry/stages.py``).
STAGES = {
    "deliver": "sent → consumer has it (produce, broker append, fetch)",
    "queue": "fetched → handler starts",
    "decode": "decode",
    "handle": "handler",
    "to_send": "handler starts → the event that carries the run on is sent",
    "ack": "handler done → outputs acknowledged",
    "done": "handler starts → record done",
    "produce": "send → broker ack (each event sent)",
    "offset_commit": "offset commit round trip (every 50 ms, off the path)",
}
#: Parts of a handler worth their own line: (process, stage, meaning).
SUB_STAGES = [("planner", "planner.history_write", "  of which PostgreSQL history commit (waited)"),
              ("planner", "planner.history_batch", "  the batch's round trip (group commit)"),
              ("planner", "planner.task_checks", "  of which task checks (tool catalogue)"),
              ("tools", "tools.claim", "  of which claiming the call (INSERT, commit)"),
              ("tools", "tools.finish", "  of which recording the result (UPDATE, commit)")]
#: A record's share of a run's critical path: the next service can start once the event is sent.
ON_PATH = ("deliver", "queue", "decode", "to_send")


def breakdown(level: Level, samples: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per process and stage: records per run, p50 and mean ms, ms per step (mean times records per step)."""
    out: dict[str, dict[str, float]] = {}

    def add(name: str, values: list[float]) -> None:
        if values:
            out[name] = {"per_run": len(values) / level.runs, "p50_ms": percentile(values, 50),
                         "mean_ms": statistics.fmean(values), "per_step_ms": sum(values) / level.steps}

    add("client.submit", level.submit_ms)
    add("client.outcome_deliver", samples.get("client", {}).get("outcomes.deliver", []))
    for process, stages_ in samples.items():
        if process == "client":
            continue
        for stage in STAGES:
            add(f"{process}.{stage}", stages_.get(f"{process}.{stage}" if stage != "produce" else "produce", []))
        for owner, stage, _ in SUB_STAGES:
            if owner == process:
                add(stage, stages_.get(stage, []))
    return out


def print_breakdown(level: Level, table: dict[str, dict[str, float]]) -> None:
    print(f"  where a step's time goes ({level.concurrency} in flight; per step = the stage's total / "
          f"{level.steps} steps):")
    print(f"    {'stage':<58} {'n/run':>6} {'p50 ms':>8} {'mean ms':>8} {'ms/step':>8}")
    meaning = {**{s: m for s, m in STAGES.items()}, **{stage: m for _, stage, m in SUB_STAGES}}
    for name, row in table.items():
        process, _, stage = name.partition(".")
        label = (f"{process} {meaning.get(stage, stage)}" if name not in meaning else meaning[name])
        if name == "client.submit":
            label = "client submit (checks, produce, ack)"
        elif name == "client.outcome_deliver":
            label = "client outcome: sent → client has it"
        print(f"    {label:<58} {row['per_run']:>6.2f} {row['p50_ms']:>8.3f} {row['mean_ms']:>8.3f} "
              f"{row['per_step_ms']:>8.3f}")
    path = sum(row["per_step_ms"] for name, row in table.items()
               if name.rpartition(".")[2] in ON_PATH and name.partition(".")[0] not in ("client",))
    path += table.get("client.outcome_deliver", {}).get("per_step_ms", 0.0)
    run_mean = statistics.fmean(level.run_ms) / level.steps_per_run
    print(f"    critical path (deliver + queue + decode + to send, every record; + the outcome's delivery): "
          f"{path:.2f} ms/step of {run_mean:.2f} ms/step measured (run mean / {level.steps_per_run})")
    cpu = {k: 1000 * v / level.steps for k, v in level.cpu_s.items()}
    print("    CPU per step: " + ", ".join(f"{k} {v:.3f} ms" for k, v in cpu.items())
          + f"; workers + broker + PostgreSQL {level.cpu_ms_per_step():.3f} ms")


def level_report(level: Level, in_process_ms: float) -> dict[str, float]:
    """The issue's keys for one concurrency."""
    run_mean = statistics.fmean(level.run_ms)
    return {"concurrency": level.concurrency, "runs": level.runs,
            "steps_per_s": round(level.steps / level.wall_s, 1),
            "overhead_per_step_ms": round(statistics.median(level.run_ms) / level.steps_per_run - in_process_ms, 2),
            "run_p50_ms": round(percentile(level.run_ms, 50), 2), "run_mean_ms": round(run_mean, 2),
            "run_p99_ms": round(percentile(level.run_ms, 99), 2),
            "hop_p50_ms": round(percentile(level.hops, 50), 2), "hop_p99_ms": round(percentile(level.hops, 99), 2),
            "cpu_ms_per_step": round(level.cpu_ms_per_step(), 3),
            "worker_cpu_ms_per_step": round(level.cpu_ms_per_step(("planner", "inference", "tools", "retrieval",
                                                                   "all")), 3)}


def parse_levels(text: str, runs: int, sequential_runs: int) -> list[tuple[int, int]]:
    levels = []
    for part in text.split(","):
        concurrency = int(part)
        levels.append((concurrency, sequential_runs if concurrency == 1 else runs))
    return levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000, help="runs per concurrency above 1")
    parser.add_argument("--sequential-runs", type=int, default=300, help="runs at concurrency 1")
    parser.add_argument("--concurrency", default="1,50",
                        help="runs in flight; several, comma-separated, are measured one after another")
    parser.add_argument("--layout", choices=["split", "split2", "single"], default="split",
                        help="one process per service (split) or `worker all` (single)")
    parser.add_argument("--telemetry", choices=["on", "off", "metrics", "tracing"], default="on",
                        help="metrics endpoints (scraped every 5 s) and tracing in every worker, or neither "
                             "(metrics / tracing: one of the two, to attribute the cost)")
    parser.add_argument("--trace-mode", choices=["file", "otlp"], default="file",
                        help="with --telemetry on: spans to a JSON-lines file, or OTLP/HTTP")
    parser.add_argument("--trace-sample", type=float, default=1.0, help="fraction of runs traced")
    parser.add_argument("--breakdown", action="store_true",
                        help="time per stage of every record, per process (AGENTSTREAM_STAGES_DIR), and CPU per process")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="plain",
                        help="plain: runs of 3 steps; conversations: turns of sessions with two parallel calls "
                             "(bench/perf/workloads.py)")
    parser.add_argument("--secure", action="store_true",
                        help="on a secure three-node stack of its own (bench/perf/bench_stacks.py), not the dev stack")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    levels = parse_levels(args.concurrency, args.runs, args.sequential_runs)

    stack = secure_stack(Settings.load().partitions) if args.secure else dev_stack(f"bench{uuid.uuid4().hex[:6]}.")
    settings = stack.settings
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    traced = args.telemetry in ("on", "tracing")
    metered = args.telemetry in ("on", "metrics")
    trace_file = log_dir / f"{settings.topic_prefix}traces.jsonl"
    env = telemetry_env(args.telemetry, args.trace_mode, args.trace_sample, trace_file)
    stages_dir = Path(tempfile.mkdtemp(prefix="agentstream-stages-")) if args.breakdown else None
    if stages_dir is not None:
        env[stages.ENV] = str(stages_dir)
        os.environ[stages.ENV] = str(stages_dir)  # this process: the client's outcome delivery
    # This process submits: with tracing on, it starts each run's root span, as a traced client would.
    client_telemetry = replace(settings.telemetry, tracing=args.trace_mode if traced else "off",
                               trace_file=trace_file, sample=args.trace_sample)
    client_tracing = Tracing.from_settings(client_telemetry)
    telemetry_tracing.install(client_tracing)
    procs = start_workers(settings, args.layout, log_dir, env, stack.worker_env if args.secure else None)
    names = {"split": ["planner", "inference", "tools", "retrieval"],
             "split2": ["planner", "planner", "inference", "tools", "retrieval"], "single": ["all"]}[args.layout]
    processes: dict[str, list[int]] = {}
    for name, proc in zip(names, procs, strict=True):
        processes.setdefault(name, []).append(proc.pid)
    processes.update({**stack.server_pids, "client": [os.getpid()]})
    try:
        asyncio.run(wait_ready(settings))
        measured, sequential_ms, scrapes = asyncio.run(measure(settings, levels, telemetry=metered,
                                                               processes=processes, workload=workload,
                                                               owner_url=stack.owner_url))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if args.secure:
            stack.close()
        else:
            topics = Topics(prefix=settings.topic_prefix, partitions=settings.partitions)
            asyncio.run(topics.delete_all(settings.kafka_bootstrap, auth=settings.kafka_auth))
    baseline = in_process_steps_per_s(2000)
    in_process_ms = 1000 / baseline
    reports = [level_report(level, in_process_ms) for level in measured]
    low, high = measured[0], measured[-1]
    out = {
        # The five figures: per step unloaded (the lowest concurrency), per second loaded (the highest).
        "overhead_per_step_ms": reports[0]["overhead_per_step_ms"], "hop_p50_ms": reports[0]["hop_p50_ms"],
        "steps_per_s": reports[-1]["steps_per_s"], "run_p99_ms": reports[-1]["run_p99_ms"],
        "cpu_ms_per_step": reports[-1]["cpu_ms_per_step"], "levels": reports,
        # The earlier keys (hop percentiles and CPU of the highest concurrency, as before).
        "hop_p99_ms": reports[-1]["hop_p99_ms"], "in_process_steps_per_s": round(baseline, 1),
        "unloaded_step_ms": round(sequential_ms, 2),
        "created_to_consumed_p50_ms": round(percentile(high.made_to_consumed, 50), 2),
        "runs": high.runs, "concurrency": high.concurrency, "layout": args.layout, "workload": workload.name,
        "telemetry": args.telemetry, "trace_mode": args.trace_mode if traced else None,
        "trace_sample": args.trace_sample if traced else None, "metrics_scrapes": scrapes,
        "worker_cpu_ms_per_step": reports[-1]["worker_cpu_ms_per_step"], "stack": stack.label,
    }
    if low is not high:
        out["loaded_hop_p50_ms"] = reports[-1]["hop_p50_ms"]
    if client_tracing is not None:
        client_tracing.shutdown()  # flushes the root spans
    spans = 0
    if traced and args.trace_mode == "file" and trace_file.exists():
        spans = sum(1 for _ in trace_file.open("rb"))
        trace_file.unlink()
    out["spans_written"] = spans
    print(f"{stack.label}; workers: {args.layout}, telemetry {args.telemetry}" + (f" (metrics scraped {scrapes}x)" if metered else "")
          + (f" (tracing {args.trace_mode}, sample {args.trace_sample:g}: {spans} spans)" if traced else ""))
    by_pid: dict[int, dict[str, list[tuple[float, float]]]] = {}
    if stages_dir is not None:
        by_pid = stages.read(stages_dir)
        own = stages.clock()
        if own is not None:
            by_pid[os.getpid()] = own.samples
            atexit.unregister(own.write)  # read here; its directory goes below
        out["breakdown"] = {}
    for level, report in zip(measured, reports, strict=True):
        print(f"{level.runs} runs x {level.steps_per_run} steps ({workload.name}), {level.concurrency} in flight")
        print(f"  throughput        {report['steps_per_s']:>8} steps/s  ({level.wall_s:.1f} s)")
        print(f"  run latency       p50 {report['run_p50_ms']} ms   p99 {report['run_p99_ms']} ms   "
              f"→ overhead {report['overhead_per_step_ms']} ms/step over {in_process_ms:.3f} ms in-process")
        print(f"  CPU per step      {report['cpu_ms_per_step']:>8} ms (workers + broker + PostgreSQL), workers "
              f"{report['worker_cpu_ms_per_step']} ms")
        print(f"  hop latency       p50 {report['hop_p50_ms']} ms   p99 {report['hop_p99_ms']} ms   "
              f"({len(level.hops)} hops, sent → consumed)")
        made = level.made_to_consumed
        print(f"  created→consumed  p50 {percentile(made, 50):.2f} ms   p99 {percentile(made, 99):.2f} ms")
        for event_type, values in sorted(level.by_type.items()):
            print(f"    {event_type:<20} p50 {percentile(values, 50):7.2f} ms   p99 {percentile(values, 99):7.2f} ms")
        if stages_dir is not None:
            samples: dict[str, dict[str, list[float]]] = {}
            for name, pids in processes.items():
                for pid in pids:
                    for stage, values in stages.window(by_pid.get(pid, {}), *level.window).items():
                        samples.setdefault(name, {}).setdefault(stage, []).extend(values)
            table = breakdown(level, samples)
            print_breakdown(level, table)
            out["breakdown"][str(level.concurrency)] = {
                "stages": {k: {m: round(v, 4) for m, v in row.items()} for k, row in table.items()},
                "cpu_ms_per_step": {k: round(1000 * v / level.steps, 4) for k, v in level.cpu_s.items()}}
    print(f"  unloaded step     {out['unloaded_step_ms']} ms through the pipeline (20 sequential runs), "
          f"{in_process_ms:.3f} ms in-process")
    if stages_dir is not None:
        shutil.rmtree(stages_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
