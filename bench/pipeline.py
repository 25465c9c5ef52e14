"""Pipeline throughput and per-hop latency: N runs of 3 steps (model → calculator → model answer).

The model is the zero-latency scripted backend, so what is measured is agentstream itself: Kafka hops,
PostgreSQL history, the planner, the runtime. Runs are submitted without the speculative retrieval
(``prefetch=False``): its cost depends on what the stack's ``default`` collection holds (nothing: an
error result at once; documents, as after ``make demo``: an embedding and a search per run), and
bench/prefetch.py measures it. Workers run as separate processes (`agentstream worker
...`, on their own topic prefix) on the stack `agentstream dev up` started (started here if needed).

Reports:
- steps/s: completed steps over the wall time from the first submit to the last outcome, with
  ``--concurrency`` runs in flight;
- per-hop latency p50/p99: for every event a service consumed, from the Kafka record's timestamp
  (stamped by the producer when it sends the event) to the moment the next service took it
  (both recorded in PostgreSQL); also shown, from the event's own created_at (which for the
  planner's requests is the start of the transition, so it includes the history write);
- overhead per step: the unloaded time per step of a run through the pipeline minus the time per step
  of the same agent loop (planner state machine, scripted model, calculator) run in-process without
  Kafka or PostgreSQL.

Telemetry (``--telemetry on``, the default): every worker serves Prometheus metrics (its own port,
scraped every 5 s by this script, as Prometheus would) and traces every run (``--trace-sample``, default
1.0: every step is a span) to a JSON-lines file (``--trace-mode file``) or OTLP (``otlp``, to
``OTEL_EXPORTER_OTLP_ENDPOINT``); the submitting client starts each run's root span. ``--telemetry off``:
no metrics endpoint and no spans (the traceparent header is still carried).

    .venv/bin/python bench/pipeline.py [--runs 1500] [--concurrency 20] [--layout split]
                                       [--telemetry on|off|metrics|tracing] [--trace-mode file|otlp] [--trace-sample 1.0] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import asyncpg

from agentstream.devstack.stack import DevStack
from agentstream.services.inference.backends.base import ChatMessage
from agentstream.services.inference.backends.scripted import scripted_reply
from agentstream.services.planner import machine
from agentstream.services.tools.builtin import evaluate
from agentstream.streams.client import AgentClient
from agentstream.streams.config import Settings
from agentstream.streams.events import InferenceCompleted, TaskSubmitted, ToolCallCompleted
from agentstream.streams.telemetry import tracing as telemetry_tracing
from agentstream.streams.telemetry.discovery import discover
from agentstream.streams.telemetry.tracing import Tracing
from agentstream.streams.tool_catalog import ToolInfo
from agentstream.streams.topics import Topics

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def in_process_steps_per_s(runs: int) -> float:
    """The same loop without Kafka or PostgreSQL: state machine + scripted model + calculator."""
    calc = [ToolInfo("calculator", "Evaluate arithmetic.", {"type": "object"})]
    topics = Topics()
    steps = 0
    t0 = time.perf_counter()
    for i in range(runs):
        now = datetime.now(UTC)
        task = TaskSubmitted.build(run_id=f"r{i}", step=f"r{i}:task", service="bench", task=f"What is {i} + 1?",
                                   tools=["calculator"], max_steps=5)
        state = machine.start(task, calc, now)
        while not state.terminal:
            machine.outputs(state, topics)  # the events it would publish
            if state.pending_kind == "model":
                msgs = tuple(ChatMessage(role=m.role, content=m.content) for m in state.messages)
                text, _ = scripted_reply(msgs)
                result = InferenceCompleted.build(run_id=state.run_id, step=state.pending_step_id, service="b",
                                                  text=text, finish_reason="stop")
            else:
                value = evaluate(state.pending_request["arguments"]["expression"])
                result = ToolCallCompleted.build(run_id=state.run_id, step=state.pending_step_id, service="b",
                                                 tool="calculator", ok=True, result=json.dumps(value))
            state = machine.advance(state, result, datetime.now(UTC))
            steps += 1
        machine.outputs(state, topics)
    return steps / (time.perf_counter() - t0)


async def submit_all(client: AgentClient, count: int, concurrency: int, offset: int) -> tuple[list[str], float]:
    semaphore = asyncio.Semaphore(concurrency)
    run_ids: list[str] = []

    async def one(i: int) -> None:
        async with semaphore:
            run_id = await client.submit(f"What is {i} + {i}?", tools=["calculator"], max_steps=5,
                                         prefetch=False)
            run_ids.append(run_id)
            result = await client.wait(run_id, timeout=300)
            if not result.ok or result.steps != 3:
                raise RuntimeError(f"run {run_id} did not take the 3 expected steps: {result}")

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


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (Linux /proc), to compare CPU per step."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


async def measure(settings: Settings, runs: int, concurrency: int, telemetry: bool = False,
                  worker_pids: list[int] | None = None) -> dict:
    stop_scraping = asyncio.Event()
    scraper = asyncio.create_task(scrape_metrics(settings, stop_scraping)) if telemetry else None
    async with AgentClient(settings) as client:
        # Warm-up at the measured concurrency: connections, statement plans, and the broker's JIT
        # (a freshly started JVM is several times slower for its first tens of seconds).
        await submit_all(client, max(300, runs // 4), concurrency, 0)
        sequential: list[float] = []
        for i in range(20):
            t0 = time.perf_counter()
            run_id = await client.submit(f"What is {i} * 2?", tools=["calculator"], max_steps=5, prefetch=False)
            await client.wait(run_id, timeout=60)
            sequential.append((time.perf_counter() - t0) * 1000 / 3)
        cpu0 = cpu_seconds(worker_pids or [])
        run_ids, wall = await submit_all(client, runs, concurrency, 100_000)
        worker_cpu = cpu_seconds(worker_pids or []) - cpu0
    scrapes = 0
    if scraper is not None:
        stop_scraping.set()
        scrapes = await scraper
    conn = await asyncpg.connect(settings.database_url)
    try:
        rows = await conn.fetch(
            """SELECT event_type, extract(epoch FROM consumed_at - appended_at) * 1000 AS hop,
                      extract(epoch FROM consumed_at - produced_at) * 1000 AS made
               FROM events WHERE run_id = ANY($1) AND consumed_at IS NOT NULL""", run_ids)
    finally:
        await conn.close()
    by_type: dict[str, list[float]] = {}
    for r in rows:
        by_type.setdefault(r["event_type"], []).append(float(r["hop"]))
    return {"steps_per_s": 3 * runs / wall, "wall_s": wall, "hops": [float(r["hop"]) for r in rows],
            "made_to_consumed": [float(r["made"]) for r in rows], "by_type": by_type,
            "sequential_step_ms": statistics.median(sequential), "scrapes": scrapes,
            "worker_cpu_ms_per_step": 1000 * worker_cpu / (3 * runs)}


def telemetry_env(mode: str, trace_mode: str, sample: float, trace_file: Path) -> dict[str, str]:
    """The workers' telemetry settings: metrics on a port of each one's own, and/or tracing; or nothing."""
    env = {"AGENTSTREAM_TRACING": "off", "AGENTSTREAM_METRICS_PORT": "off"}
    if mode in ("on", "metrics"):
        env.update({"AGENTSTREAM_METRICS_PORT": "0", "AGENTSTREAM_METRICS_HOST": "127.0.0.1"})
    if mode in ("on", "tracing"):
        env.update({"AGENTSTREAM_TRACING": trace_mode, "AGENTSTREAM_TRACE_FILE": str(trace_file),
                    "AGENTSTREAM_TRACE_SAMPLE": str(sample)})
    return env


def start_workers(settings: Settings, layout: str, log_dir: Path,
                  extra_env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url,
           "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix, "AGENTSTREAM_PARTITIONS": str(settings.partitions),
           **(extra_env or {})}
    groups = {"single": [["all"]], "split": [["planner"], ["inference"], ["tools"], ["retrieval"]],
              "split2": [["planner"], ["planner"], ["inference"], ["tools"], ["retrieval"]]}[layout]
    procs = []
    for group in groups:
        log = open(log_dir / f"worker-{group[0]}.log", "ab")
        procs.append(subprocess.Popen([sys.executable, "-m", "agentstream.cli", "worker", *group, "--log-level", "WARNING"],
                                      env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    return procs


async def wait_ready(settings: Settings, timeout: float = 60) -> None:
    """Until a run completes end to end (every group joined, tools registered)."""
    deadline = time.monotonic() + timeout
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=20, help="runs in flight")
    parser.add_argument("--layout", choices=["split", "split2", "single"], default="split",
                        help="one process per service (split) or `worker all` (single)")
    parser.add_argument("--telemetry", choices=["on", "off", "metrics", "tracing"], default="on",
                        help="metrics endpoints (scraped every 5 s) and tracing in every worker, or neither "
                             "(metrics / tracing: one of the two, to attribute the cost)")
    parser.add_argument("--trace-mode", choices=["file", "otlp"], default="file",
                        help="with --telemetry on: spans to a JSON-lines file, or OTLP/HTTP")
    parser.add_argument("--trace-sample", type=float, default=1.0, help="fraction of runs traced")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()

    status = DevStack().up()
    settings = replace(Settings.load(), kafka_bootstrap=status.kafka, database_url=status.database_url,
                       topic_prefix=f"bench{uuid.uuid4().hex[:6]}.")
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    traced = args.telemetry in ("on", "tracing")
    metered = args.telemetry in ("on", "metrics")
    trace_file = log_dir / f"{settings.topic_prefix}traces.jsonl"
    env = telemetry_env(args.telemetry, args.trace_mode, args.trace_sample, trace_file)
    # This process submits: with tracing on, it starts each run's root span, as a traced client would.
    client_telemetry = replace(settings.telemetry, tracing=args.trace_mode if traced else "off",
                               trace_file=trace_file, sample=args.trace_sample)
    client_tracing = Tracing.from_settings(client_telemetry)
    telemetry_tracing.install(client_tracing)
    procs = start_workers(settings, args.layout, log_dir, env)
    try:
        asyncio.run(wait_ready(settings))
        result = asyncio.run(measure(settings, args.runs, args.concurrency, telemetry=metered,
                                     worker_pids=[p.pid for p in procs]))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        asyncio.run(Topics(prefix=settings.topic_prefix, partitions=settings.partitions).delete_all(settings.kafka_bootstrap))
    baseline = in_process_steps_per_s(2000)
    hops = result["hops"]
    out = {
        "steps_per_s": round(result["steps_per_s"], 1),
        "hop_p50_ms": round(percentile(hops, 50), 2),
        "hop_p99_ms": round(percentile(hops, 99), 2),
        "overhead_per_step_ms": round(result["sequential_step_ms"] - 1000 / baseline, 2),
        "in_process_steps_per_s": round(baseline, 1),
        "unloaded_step_ms": round(result["sequential_step_ms"], 2),
        "created_to_consumed_p50_ms": round(percentile(result["made_to_consumed"], 50), 2),
        "runs": args.runs, "concurrency": args.concurrency, "layout": args.layout,
        "telemetry": args.telemetry, "trace_mode": args.trace_mode if traced else None,
        "trace_sample": args.trace_sample if traced else None, "metrics_scrapes": result["scrapes"],
        "worker_cpu_ms_per_step": round(result["worker_cpu_ms_per_step"], 3),
    }
    if client_tracing is not None:
        client_tracing.shutdown()  # flushes the root spans
    spans = 0
    if traced and args.trace_mode == "file" and trace_file.exists():
        spans = sum(1 for _ in trace_file.open("rb"))
        trace_file.unlink()
    out["spans_written"] = spans
    print(f"{args.runs} runs x 3 steps, {args.concurrency} in flight, workers: {args.layout}, telemetry "
          f"{args.telemetry}" + (f" (metrics scraped {result['scrapes']}x)" if metered else "")
          + (f" (tracing {args.trace_mode}, sample {args.trace_sample:g}: {spans} spans)" if traced else ""))
    print(f"  throughput        {out['steps_per_s']:>8} steps/s  ({result['wall_s']:.1f} s)")
    print(f"  worker CPU        {out['worker_cpu_ms_per_step']:>8} ms per step (all worker processes)")
    made = result["made_to_consumed"]
    print(f"  hop latency       p50 {out['hop_p50_ms']} ms   p99 {out['hop_p99_ms']} ms   ({len(hops)} hops, "
          "sent → consumed)")
    print(f"  created→consumed  p50 {percentile(made, 50):.2f} ms   p99 {percentile(made, 99):.2f} ms")
    for event_type, values in sorted(result["by_type"].items()):
        print(f"    {event_type:<20} p50 {percentile(values, 50):7.2f} ms   p99 {percentile(values, 99):7.2f} ms")
    print(f"  unloaded step     {out['unloaded_step_ms']} ms through the pipeline, "
          f"{1000 / baseline:.3f} ms in-process → overhead {out['overhead_per_step_ms']} ms/step")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
