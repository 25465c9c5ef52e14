"""Sub-agents (issue 34): what a call to another agent adds, and trees against flat runs.

**Latency of a sub-agent call**: runs of a parent agent whose model calls one child agent, one run at a
time on the dev stack (scripted model, one worker of each service in this process). From the history
(the planner's clock, ``steps.requested_at``): the parent's call step (its child's ``TaskSubmitted`` going
out, recorded with the transition) to the child's first model request — a hop through ``agent.tasks``, the
child's admission (the agent resolved, its instructions built) and the transition that asks its model.
Also: the call step's whole time (requested → the child's outcome applied as its result).

**Trees against flat runs** (throughput, ``--tree-runs``): at ``--concurrency`` in flight, parents that call
3 children at once (each child one model step), alternating with flat runs of the same step count
(a model step, three tool calls at once, a model step: 5 steps, as the parent's own), steps/s over the
runs' own steps plus, for trees, the children's.

    .venv/bin/python -m bench.perf.subagents [--runs 40] [--tree-runs 200] [--concurrency 50] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
import uuid
from dataclasses import replace
from typing import Any

from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.agents import Agent
from agentstream.testing import Pipeline

CHILD = Agent(name="bench_child", system_prompt="[[answer:child answer]]", max_steps=2, prefetch=False)
PARENT = Agent(name="bench_parent", system_prompt="You delegate.", calls=["bench_child"], max_steps=8, prefetch=False)
ONE_CHILD = '[[tool:agent__bench_child {"task": "look it up"}]] [[answer:done]]'
THREE_CHILDREN = ("[[tools:" + " | ".join(f'agent__bench_child {{"task": "part {k}"}}' for k in range(3))
                  + "]] [[answer:done]]")
FLAT = "[[tools:" + " | ".join(f'calculator {{"expression": "{k} + 1"}}' for k in range(3)) + "]] [[answer:done]]"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def call_latency(pipe: Pipeline, runs: int) -> dict[str, Any]:
    pool = await pipe.client.pool()
    hop: list[float] = []
    whole: list[float] = []
    for i in range(runs + 3):  # the first three warm up
        run_id = await pipe.client.submit(ONE_CHILD, agent="bench_parent")
        result = await pipe.client.wait(run_id, timeout=60)
        if not result.ok:
            raise SystemExit(f"the parent {run_id} failed: {result}")
        row = await pool.fetchrow(
            """SELECT p.requested_at AS asked, p.completed_at AS answered,
                      (SELECT min(c.requested_at) FROM steps c WHERE c.run_id = p.request->>'child_run_id'
                       AND c.kind = 'model') AS child_model
               FROM steps p WHERE p.run_id = $1 AND p.kind = 'tool'""", run_id)
        if i >= 3:
            hop.append((row["child_model"] - row["asked"]).total_seconds() * 1000)
            whole.append((row["answered"] - row["asked"]).total_seconds() * 1000)
    return {"runs": runs, "call_to_child_model_p50_ms": round(percentile(hop, 50), 2),
            "call_to_child_model_p99_ms": round(percentile(hop, 99), 2),
            "call_step_p50_ms": round(percentile(whole, 50), 2), "call_step_p99_ms": round(percentile(whole, 99), 2)}


async def throughput(pipe: Pipeline, runs: int, concurrency: int, tree: bool) -> float:
    """Steps/s of ``runs`` trees (their children's steps counted) or flat runs of 5 steps."""
    semaphore = asyncio.Semaphore(concurrency)
    steps = 0

    async def one() -> None:
        nonlocal steps
        async with semaphore:
            run_id = await (pipe.client.submit(THREE_CHILDREN, agent="bench_parent") if tree else
                            pipe.client.submit(FLAT, tools=["calculator"], max_steps=8, prefetch=False))
            result = await pipe.client.wait(run_id, timeout=120)
            if not result.ok:
                raise SystemExit(f"{run_id} failed: {result}")
            steps += result.steps + (3 if tree else 0)  # each child: one model step

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(runs)))
    return steps / (time.perf_counter() - t0)


async def measure(settings: Settings, runs: int, tree_runs: int, concurrency: int, rounds: int) -> dict[str, Any]:
    options = WorkerOptions(backend="scripted")
    async with Pipeline.start(settings, options) as pipe:
        await pipe.client.agents.register(CHILD, PARENT)
        latency = await call_latency(pipe, runs)
        await throughput(pipe, concurrency, concurrency, True)  # warm-up
        samples: dict[str, list[float]] = {"tree": [], "flat": []}
        for r in range(rounds):
            for name in (("tree", "flat") if r % 2 == 0 else ("flat", "tree")):
                samples[name].append(await throughput(pipe, tree_runs, concurrency, name == "tree"))
    tree, flat = statistics.median(samples["tree"]), statistics.median(samples["flat"])
    return {**latency, "concurrency": concurrency, "tree_runs": tree_runs, "rounds": rounds,
            "tree_steps_per_s": round(tree, 1), "flat_steps_per_s": round(flat, 1),
            "tree_vs_flat": round(tree / flat, 3),
            "samples": {k: [round(x, 1) for x in v] for k, v in samples.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40, help="parents of one child, one at a time (latency)")
    parser.add_argument("--tree-runs", type=int, default=200, help="runs per throughput sample")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="alternating tree/flat samples")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from agentstream.cli.common import run_async
    from agentstream.devstack.stack import DevStack

    status = DevStack().up()
    settings = replace(Settings.load(), kafka_bootstrap=status.kafka, database_url=status.database_url,
                       topic_prefix=f"benchsa{uuid.uuid4().hex[:6]}.")
    result = run_async(measure(settings, args.runs, args.tree_runs, args.concurrency, args.rounds))
    print(f"sub-agent call, {args.runs} parents one at a time: call step → child's first model request "
          f"p50 {result['call_to_child_model_p50_ms']} ms, p99 {result['call_to_child_model_p99_ms']} ms; "
          f"the whole call step p50 {result['call_step_p50_ms']} ms")
    print(f"at {args.concurrency} in flight: trees of 3 children {result['tree_steps_per_s']} steps/s, flat runs "
          f"{result['flat_steps_per_s']} steps/s: {result['tree_vs_flat']}x")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
