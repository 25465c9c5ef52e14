"""Replay: how fast `replay show` is on a 100-step run, and how much faster a recorded rerun is.

1. **show**: a run of 101 steps (50 calculator calls, each a model step and a tool step, then the
   answer; scripted model, prefetch off) is made on the stack `agentstream dev up` started. Then
   ``agentstream.streams.replay.timeline.show`` — the PostgreSQL timeline plus the Kafka cross-check of every event
   (about 300 records read back and decoded) — runs ``--reps`` times in this process, each time with
   its own PostgreSQL connection and Kafka clients, as the CLI does. Reported: the first (cold) and
   the median, p90 and max of the rest, and the HTML rendering on top.
2. **recorded rerun**: a 5-step run (model → tool → model → retrieval → model answer) whose scripted
   model takes ``--model-ms`` per step, replayed in recorded mode ``--reruns`` times, each in a fresh
   replay session (own topic prefix, planner and responder), as `agentstream replay rerun` does.
   Speed-up = the original run's duration / the rerun's (the runs' own submitted → finished times).

    .venv/bin/python -m bench.perf.replay [--reps 20] [--reruns 3] [--model-ms 400] [--json]

With --json the last line is one JSON object with ``show_100_steps_ms`` (median) and
``recorded_speedup`` (median), among others.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import uuid
from dataclasses import replace

from agentstream.devstack.stack import DevStack
from agentstream.replay.html import render
from agentstream.replay.rerun import ReplaySession, delete_topics
from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.replay import timeline
from agentstream.testing import Pipeline

TOOL_CALLS = 50


async def make_runs(settings: Settings, model_ms: int) -> tuple[str, str]:
    # The runs' topics must outlive the pipeline: `show` reads their events back from Kafka.
    async with Pipeline.start(settings, WorkerOptions(backend="scripted"), delete_topics=False) as pipe:
        long_task = " ".join(f'[[tool:calculator {{"expression": "{i} + 1"}}]]' for i in range(TOOL_CALLS))
        long_run = await pipe.client.submit(long_task + " [[answer:done]]", tools=["calculator"],
                                            max_steps=120, prefetch=False)
        slow_task = (f'[[slow:{model_ms}]] [[tool:calculator {{"expression": "6 * 7"}}]] '
                     "[[retrieve:kafka log compaction]] How does kafka log compaction work?")
        slow_run = await pipe.client.submit(slow_task, tools=["calculator"], max_steps=8)
        for run_id in (long_run, slow_run):
            result = await pipe.client.wait(run_id, timeout=300)
            if not result.ok:
                raise SystemExit(f"the benchmark run {run_id} failed: {result}")
    return long_run, slow_run


async def measure_show(settings: Settings, run_id: str, reps: int) -> dict:
    codec = codec_for(settings)
    times: list[float] = []
    tl = None
    for _ in range(reps + 1):
        started = time.perf_counter()
        tl = await timeline.show(settings, run_id, codec=codec)
        times.append((time.perf_counter() - started) * 1000)
    assert tl is not None
    started = time.perf_counter()
    page = render(tl)
    render_ms = (time.perf_counter() - started) * 1000
    warm = sorted(times[1:])
    return {"steps": len(tl.steps), "events": len(tl.events), "kafka": tl.kafka_counts(),
            "first_ms": round(times[0], 1), "median_ms": round(statistics.median(warm), 1),
            "p90_ms": round(warm[int(0.9 * (len(warm) - 1))], 1), "max_ms": round(warm[-1], 1),
            "html_render_ms": round(render_ms, 1), "html_bytes": len(page)}


async def measure_rerun(settings: Settings, run_id: str, reruns: int) -> dict:
    out: list[dict] = []
    for _ in range(reruns):
        async with ReplaySession(settings, "recorded") as session:
            r = await session.replay(run_id)
        if not (r.finished and r.same_decisions):
            raise SystemExit(f"the recorded rerun differed: {r.diff.to_dict()}")
        out.append({"run_id": r.run_id, "original_ms": round(r.original_ms, 1),
                    "rerun_ms": round(r.result.duration_ms, 1), "speedup": round(r.speedup, 1)})
    return {"reruns": out, "median_speedup": round(statistics.median(x["speedup"] for x in out), 1),
            "min_speedup": min(x["speedup"] for x in out),
            "median_rerun_ms": round(statistics.median(x["rerun_ms"] for x in out), 1),
            "original_ms": out[0]["original_ms"]}


async def main_async(args: argparse.Namespace, settings: Settings) -> dict:
    try:
        long_run, slow_run = await make_runs(settings, args.model_ms)
        show = await measure_show(settings, long_run, args.reps)
        reruns = await measure_rerun(settings, slow_run, args.reruns)
    finally:
        await delete_topics(settings)
    return {"show_100_steps_ms": show["median_ms"], "recorded_speedup": reruns["median_speedup"],
            "show": show, "rerun": reruns, "model_ms": args.model_ms, "runs": [long_run, slow_run]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=20, help="timed `show` calls (after one cold call)")
    parser.add_argument("--reruns", type=int, default=3, help="recorded reruns, each in a fresh session")
    parser.add_argument("--model-ms", type=int, default=400, help="the scripted model's latency per step")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    status = DevStack().up()
    settings = replace(Settings.load(), kafka_bootstrap=status.kafka, database_url=status.database_url,
                       topic_prefix=f"benchrp{uuid.uuid4().hex[:6]}.")
    from agentstream.cli.common import run_async  # uvloop, as the CLI runs

    result = run_async(main_async(args, settings))
    s, r = result["show"], result["rerun"]
    print(f"replay show, {s['steps']} steps, {s['events']} events ({s['kafka']}):")
    print(f"  first {s['first_ms']} ms · median {s['median_ms']} ms · p90 {s['p90_ms']} ms · max {s['max_ms']} ms"
          f" · HTML render {s['html_render_ms']} ms ({s['html_bytes']} bytes)")
    print(f"recorded rerun of a 5-step run, model {args.model_ms} ms/step: original {r['original_ms']} ms")
    for x in r["reruns"]:
        print(f"  rerun {x['rerun_ms']} ms → {x['speedup']}x")
    print(f"  median speed-up {r['median_speedup']}x (min {r['min_speedup']}x)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
