"""The planner's deadline timer: the cost of one tick with a full run cache (100,000 runs, 50 active).

The timer runs four times a second on the planner's event loop; while it runs, no record is handled.
Before issue 15 it looked at every cached state (finished ones included); now only at active ones
(``services/planner/cache.py``).

    .venv/bin/python -m bench.perf.planner_tick [--cached 100000] [--active 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime

from agentstream.services.planner import machine
from agentstream.services.planner.cache import RunCache
from agentstream.services.planner.service import Planner
from agentstream.services.planner.sweeper import Sweeper
from agentstream.streams.core.events import TaskSubmitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cached", type=int, default=100_000)
    parser.add_argument("--active", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    now = datetime.now(UTC)
    task = TaskSubmitted.build(run_id="r", step="r:task", service="bench", task="t", tools=[], max_steps=5)
    running = machine.start(task, [], now)
    finished = machine.fail(running, now, "internal_error", "finished")
    cache = RunCache(args.cached)
    states = [replace(running if i < args.active else finished, run_id=f"run-{i}") for i in range(args.cached)]
    for s in states:
        cache.remember(s)
    # a tick reads the cache and asks the sweeper about each state; the planner itself is not needed
    sweeper = Sweeper(Planner.__new__(Planner), step_timeout_s=60.0, deadline_tick_s=0.25)

    def timed(tick) -> float:
        ticks = []
        for _ in range(20):
            t0 = time.perf_counter()
            tick(datetime.now(UTC))
            ticks.append((time.perf_counter() - t0) * 1000)
        return round(statistics.median(ticks), 4)

    out = {"cached": args.cached, "active": args.active,
           "tick_ms": timed(lambda now: [s for s in cache.active() if sweeper.due(s, now)]),
           # the loop before issue 15: every cached state, finished or not
           "tick_ms_scanning_all": timed(lambda now: [s for s in list(states) if not s.terminal
                                                      and sweeper.due(s, now)])}
    print(f"one deadline tick, {args.cached} cached runs ({args.active} active): {out['tick_ms']} ms; "
          f"scanning every cached state as before: {out['tick_ms_scanning_all']} ms (medians of 20)")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
