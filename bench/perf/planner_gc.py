"""The planner's garbage-collection pauses once its run cache is full.

CPython's cyclic collector stops the event loop for a full (generation 2) collection, whose length grows
with every tracked object in the process, and starts one each time the survivors since the last one
reach a quarter of the long-lived objects. A long-running planner's largest store of objects is its run
cache: with finished runs kept up to the cache's size (100,000), a full collection scanned about 850,000
objects. This drives the real state machine (scripted model, calculator: 3 steps a run) through a
``RunCache`` as the planner uses it (each new state remembered), past the point where the cache is full,
and times every collection the interpreter starts by itself (``gc.callbacks``).

    .venv/bin/python -m bench.perf.planner_gc [--runs 300000] [--cache-size 100000] [--finished-size 1000] [--json]

``--finished-size`` equal to ``--cache-size`` keeps finished runs as the planner did before it had a
separate, small memory of finished runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from agentstream.services.planner.cache import FINISHED_SIZE, RunCache
from bench.perf.scripted_agent import run_agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300_000)
    parser.add_argument("--cache-size", type=int, default=100_000)
    parser.add_argument("--finished-size", type=int, default=FINISHED_SIZE)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    cache = RunCache(args.cache_size, finished_size=args.finished_size)
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started: list[float] = []

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        else:
            pauses[info["generation"]].append((time.perf_counter() - started.pop()) * 1000)

    gc.collect()
    gc.callbacks.append(timed)
    t0 = time.perf_counter()
    for i in range(args.runs):
        run_agent(i, remember=cache.remember)
    wall = time.perf_counter() - t0
    gc.callbacks.remove(timed)
    full = pauses[2]
    out = {"runs": args.runs, "cache_size": args.cache_size, "finished_size": cache.finished_size,
           "cached": len(cache), "tracked_objects": len(gc.get_objects()), "wall_s": round(wall, 1),
           "full_collections": len(full), "full_pause_ms_median": round(statistics.median(full), 1) if full else 0.0,
           "full_pause_ms_max": round(max(full), 1) if full else 0.0,
           "full_pause_ms_total": round(sum(full), 1),
           "young_pause_ms_total": round(sum(pauses[0]) + sum(pauses[1]), 1)}
    print(f"{args.runs} runs through a cache of {args.cache_size} ({cache.finished_size} finished kept), "
          f"{out['tracked_objects']} objects tracked at the end: {out['full_collections']} full collections, "
          f"pause median {out['full_pause_ms_median']} ms, max {out['full_pause_ms_max']} ms, "
          f"{out['full_pause_ms_total']} ms in all; young collections {out['young_pause_ms_total']} ms in all; "
          f"{wall:.1f} s")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
