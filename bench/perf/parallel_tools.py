"""Parallel tool calls: one model reply asking for 4 tools of 200 ms each, against the same 4 calls made
one after another (issue 32: the parallel step's wall time must be at most 0.35 times the sequential one).

Each round runs two runs through the whole pipeline on the dev stack (scripted model, prefetch off, one
worker of each service, in this process): **parallel** — the model's first reply is one ``tools`` action
with 4 calls of ``bench_pause`` (200 ms), then it answers; **sequential** — 4 replies of one
``bench_pause`` call each, then the answer. The rounds alternate the order of the two runs.

Measured from the run's ``steps`` rows (the planner's clock): the parallel step is the fan-out (the calls'
``requested_at``, one transition) to the fan-in (the last call's ``completed_at``, when the planner applied
its result); the sequential calls are the sum of each call's ``requested_at`` → ``completed_at`` (the
model steps between them are left out: "the same calls one after another"). Also reported: both runs'
durations, submitted → outcome.

    .venv/bin/python -m bench.perf.parallel_tools [--rounds 5] [--calls 4] [--call-ms 200] [--json]

With --json the last line is one JSON object with ``ratio`` (median parallel step / median sequential
calls), among others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import uuid
from dataclasses import replace
from datetime import datetime
from typing import Any

from agentstream.services.tools.registry import tool
from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.settings import Settings
from agentstream.testing import Pipeline

#: The tools this module serves (``tool_modules``): a call that takes ``ms`` and does nothing else.
MODULE = "bench.perf.parallel_tools"
TARGET_RATIO = 0.35


@tool(description="Wait for a number of milliseconds (benchmark).", idempotent=True, timeout_s=30)
async def bench_pause(ms: int) -> str:
    await asyncio.sleep(ms / 1000)
    return f"paused {ms} ms"


def tasks(calls: int, call_ms: int) -> tuple[str, str]:
    """The parallel and the sequential task, in scripted-model directives."""
    call = f'bench_pause {{"ms": {call_ms}}}'
    parallel = "[[tools:" + " | ".join([call] * calls) + "]] [[answer:done]]"
    sequential = " ".join([f"[[tool:{call}]]"] * calls) + " [[answer:done]]"
    return parallel, sequential


def _ms(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds() * 1000


def tool_steps(status: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in status["steps"] if s["kind"] == "tool"]


def parallel_step_ms(steps: list[dict[str, Any]]) -> float:
    """The fan-out (one transition) to the fan-in (the last call's result applied)."""
    assert len({s["requested_at"] for s in steps}) == 1, "the calls were not fanned out in one transition"
    return _ms(steps[0]["requested_at"], max(s["completed_at"] for s in steps))


def sequential_ms(steps: list[dict[str, Any]]) -> float:
    return sum(_ms(s["requested_at"], s["completed_at"]) for s in steps)


async def measure(settings: Settings, rounds: int, calls: int, call_ms: int) -> dict[str, Any]:
    parallel_task, sequential_task = tasks(calls, call_ms)
    options = WorkerOptions(backend="scripted", tool_modules=("agentstream.services.tools.builtin", MODULE))
    out: dict[str, list[float]] = {"parallel_step_ms": [], "sequential_ms": [], "parallel_run_ms": [],
                                   "sequential_run_ms": []}
    async with Pipeline.start(settings, options) as pipe:
        for i in range(rounds + 1):  # the first round warms the pipeline up and is not counted
            order = [("parallel", parallel_task), ("sequential", sequential_task)]
            for name, task in order if i % 2 == 0 else order[::-1]:
                run_id = await pipe.client.submit(task, tools=["bench_pause"], max_steps=2 * calls + 2,
                                                  prefetch=False)
                result = await pipe.client.wait(run_id, timeout=60)
                if not result.ok:
                    raise SystemExit(f"the {name} run {run_id} failed: {result}")
                steps = tool_steps(await pipe.client.status(run_id))
                if len(steps) != calls:
                    raise SystemExit(f"the {name} run {run_id} made {len(steps)} tool calls, not {calls}")
                if i == 0:
                    continue
                out[f"{name}_run_ms"].append(result.duration_ms)
                if name == "parallel":
                    out["parallel_step_ms"].append(parallel_step_ms(steps))
                else:
                    out["sequential_ms"].append(sequential_ms(steps))
    medians = {k: round(statistics.median(v), 1) for k, v in out.items()}
    ratio = round(medians["parallel_step_ms"] / medians["sequential_ms"], 3)
    return {"calls": calls, "call_ms": call_ms, "rounds": rounds, "ratio": ratio, "target": TARGET_RATIO,
            "ok": ratio <= TARGET_RATIO, **{f"median_{k}": v for k, v in medians.items()},
            "samples": {k: [round(x, 1) for x in v] for k, v in out.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds (one parallel and one sequential run each)")
    parser.add_argument("--calls", type=int, default=4, help="tool calls per run")
    parser.add_argument("--call-ms", type=int, default=200, help="how long each call takes")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from agentstream.cli.common import run_async  # uvloop, as the CLI runs
    from agentstream.devstack.stack import DevStack

    status = DevStack().up()
    settings = replace(Settings.load(), kafka_bootstrap=status.kafka, database_url=status.database_url,
                       topic_prefix=f"benchpt{uuid.uuid4().hex[:6]}.")
    result = run_async(measure(settings, args.rounds, args.calls, args.call_ms))
    print(f"{args.calls} calls of {args.call_ms} ms, {args.rounds} rounds (medians):")
    print(f"  one reply, calls side by side: step {result['median_parallel_step_ms']} ms "
          f"(run {result['median_parallel_run_ms']} ms)")
    print(f"  one call per reply: calls {result['median_sequential_ms']} ms "
          f"(run {result['median_sequential_run_ms']} ms)")
    print(f"  ratio {result['ratio']} (target ≤ {TARGET_RATIO}: {'met' if result['ok'] else 'NOT met'})")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
