"""Time saved per run by speculative retrieval (prefetch).

Runs whose model first asks to retrieve the task's subject, then answers: with prefetch the planner
starts that retrieval alongside the first model call, so when the model asks, the passages are there (or
on their way). Each configuration runs ``--runs`` runs, a few at a time, with the scripted model taking
``L`` ms per step (L = 0, 100, 300: the retrieval either races the model call or finishes well within
it), on the stack `agentstream dev up` started, with workers in this process.

Reports, per model latency: median run duration with and without prefetch, their difference (time
saved per run), and the planner's own accounting (``saved_ms`` on each retrieval step served by the
prefetch).

    .venv/bin/python -m bench.perf.prefetch [--runs 40] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import uuid
from dataclasses import replace

from agentstream.devstack.stack import DevStack
from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.settings import Settings
from agentstream.testing import Pipeline

DOC = ("Log compaction keeps the latest value for every key of a Kafka topic and removes older values, "
       "so a compacted topic works as a changelog that can rebuild a table.")


async def measure(settings: Settings, runs: int, latencies: list[int]) -> dict:
    out: dict = {}
    async with Pipeline.start(settings, WorkerOptions(backend="scripted")) as pipe:
        pool = await pipe.client.pool()
        await pool.execute("""INSERT INTO documents (collection, source, content, content_hash)
                              VALUES ('default', 'bench-prefetch', $1, $2) ON CONFLICT DO NOTHING""",
                           DOC, "bench-prefetch-doc")
        for latency in latencies:
            task = f"[[slow:{latency}]] [[retrieve:kafka log compaction]] [[answer:done]] How does kafka log compaction work?"
            durations: dict[bool, list[float]] = {True: [], False: []}
            saved: list[float] = []
            for batch in range(0, runs, 4):
                for prefetch in (True, False):
                    ids = [await pipe.client.submit(task, tools=[], prefetch=prefetch)
                           for _ in range(min(4, runs - batch))]
                    results = await asyncio.gather(*(pipe.client.wait(r, timeout=60) for r in ids))
                    durations[prefetch] += [r.duration_ms for r in results if r.ok]
                    if prefetch:
                        rows = await pool.fetch("""SELECT (result->>'saved_ms')::float AS s FROM steps
                                                   WHERE run_id = ANY($1) AND kind = 'retrieval'
                                                   AND result ? 'from_prefetch'""", ids)
                        saved += [r["s"] for r in rows]
            with_p, without_p = statistics.median(durations[True]), statistics.median(durations[False])
            out[latency] = {"with_ms": round(with_p, 1), "without_ms": round(without_p, 1),
                            "saved_per_run_ms": round(without_p - with_p, 1),
                            "planner_saved_ms_median": round(statistics.median(saved), 1) if saved else None,
                            "served_from_prefetch": f"{len(saved)}/{len(durations[True])}"}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    status = DevStack().up()
    settings = replace(Settings.load(), kafka_bootstrap=status.kafka, database_url=status.database_url,
                       topic_prefix=f"benchpf{uuid.uuid4().hex[:6]}.")
    result = asyncio.run(measure(settings, args.runs, [0, 100, 300]))
    print(f"{'model ms/step':>14} {'with prefetch':>14} {'without':>9} {'saved/run':>10} {'planner saved_ms':>17} served")
    for latency, r in result.items():
        print(f"{latency:>14} {r['with_ms']:>14} {r['without_ms']:>9} {r['saved_per_run_ms']:>10} "
              f"{r['planner_saved_ms_median']!s:>17} {r['served_from_prefetch']}")
    if args.json:
        print(json.dumps({str(k): v for k, v in result.items()}))


if __name__ == "__main__":
    main()
