"""What an idle stack costs: every worker, the broker and PostgreSQL up, no load (issue 35).

At one run in flight the stack burned several times more CPU per step than at fifty: polling, timers,
heartbeats and commits that run whether or not there is work. This measures that floor directly. On a
stack of its own (``PrivateStack``: a fresh broker with only the catalogue's topics, free ports, removed
afterwards; the development stack may hold thousands of topics left by tests, which a deployment does not),
it starts the workers (``--layout split``: one process per service, as a deployment runs them), waits until
a run has gone through every service, lets the stack settle (``--settle-s``: the first run's after-effects,
the JVM compiling), then reads each process's CPU time from ``/proc`` over ``--seconds`` and reports it as
a percentage of one core, per process and in all (``idle_cpu_pct``). PostgreSQL is counted with its
backends (they come and go). The client that submitted the first run is closed before the window opens.

    .venv/bin/python -m bench.perf.idle_cpu [--seconds 60] [--settle-s 15] [--layout split|single] [--partitions 8]
                                            [--env KEY=VALUE ...] [--broker-config KEY=VALUE ...] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from agentstream.devstack.private import PrivateStack
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from bench.perf.pipeline import start_workers
from bench.perf.proc_cpu import cpu_seconds

ROOT = Path(__file__).resolve().parents[2]
#: The settings' default partitions per topic (``Settings.partitions``), what ``dev up`` makes.
DEFAULT_PARTITIONS = next(f.default for f in dataclasses.fields(Settings) if f.name == "partitions")
LAYOUTS = {"split": ["planner", "inference", "tools", "retrieval"], "single": ["all"]}


async def one_run(stack: PrivateStack, partitions: int, timeout_s: float = 180) -> None:
    """Until a run has gone through the planner, inference and the tools (every group joined)."""
    settings = stack.settings(partitions=partitions)
    await ensure_topics(stack.bootstrap, Topics.of(settings).specs(), auth=stack.auth())
    deadline = time.monotonic() + timeout_s
    async with AgentClient(settings) as client:
        while True:
            try:
                run_id = await client.submit("What is 2 * 21?", tools=["calculator"])
                result = await client.wait(run_id, timeout=max(1.0, deadline - time.monotonic()))
                if result.ok:
                    return
            except Exception:
                if time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.5)


def measure(pids: dict[str, list[int]], seconds: float) -> dict[str, float]:
    """Each group's CPU over ``seconds`` as a percentage of one core."""
    before = {name: cpu_seconds(p, children=name == "postgres") for name, p in pids.items()}
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    after = {name: cpu_seconds(p, children=name == "postgres") for name, p in pids.items()}
    return {name: round(100 * (after[name] - before[name]) / wall, 2) for name in pids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--settle-s", type=float, default=15.0, help="idle time before the window opens")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="split")
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS,
                        help="of every topic (the settings' default: 8)")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every worker (repeatable), e.g. to compare an idle-loop lever")
    parser.add_argument("--broker-config", action="append", default=[], metavar="KEY=VALUE",
                        help="a broker property (repeatable), appended to the node's configuration")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    broker = dict(item.split("=", 1) for item in args.broker_config)

    workdir = Path(tempfile.mkdtemp(prefix="agentstream-idle-"))
    stack = PrivateStack(workdir / "state", broker_overrides=broker)
    procs: dict[str, subprocess.Popen] = {}
    try:
        asyncio.run(stack.start())
        logs = workdir / "logs"
        logs.mkdir()
        # The pipeline benchmark's launcher: its layouts, connected to this stack, the catalogue unprefixed.
        settings = stack.settings(partitions=args.partitions)
        started = start_workers(settings, args.layout, logs, {"AGENTSTREAM_TRACING": "off", **extra},
                                lambda _service: stack.env())
        procs = dict(zip(LAYOUTS[args.layout], started, strict=True))
        asyncio.run(one_run(stack, args.partitions))
        time.sleep(args.settle_s)
        pids = {name: [proc.pid] for name, proc in procs.items()}
        pids["broker"] = [pid] if (pid := stack.kafka_pid()) is not None else []
        pids["postgres"] = [pid] if (pid := stack.postgres_pid()) is not None else []
        by_process = measure(pids, args.seconds)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        asyncio.run(stack.close())
        shutil.rmtree(workdir, ignore_errors=True)
    workers = round(sum(v for k, v in by_process.items() if k not in ("broker", "postgres")), 2)
    total = round(sum(by_process.values()), 2)
    print(f"idle stack ({args.layout}, {args.seconds:.0f} s after {args.settle_s:.0f} s settling): {total} % of one core")
    for name, pct in by_process.items():
        print(f"  {name:<10} {pct:>6} %")
    if args.json:
        print(json.dumps({"idle_cpu_pct": total, "workers_pct": workers, "by_process": by_process,
                          "seconds": args.seconds, "settle_s": args.settle_s, "layout": args.layout,
                          "partitions": args.partitions, "env": extra, "broker_config": broker}))


if __name__ == "__main__":
    main()
