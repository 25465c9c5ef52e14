"""What PostgreSQL spends recording the planner's transitions, by group-commit size.

The planner records every transition through one call of ``agentstream_record_transitions`` (migration
0008) per batch (streams/store/history.py: group commit). At one run in flight each call carries one
transition; at 50 in flight, about 13. This benchmark measures what that difference is worth, on the
documents the real planner wrote:

1. capture: ``bench/perf/pipeline.py --concurrency 1`` runs with ``AGENTSTREAM_HISTORY_CAPTURE`` set, so its
   planner appends every batch document it sends to a file (or ``--docs FILE`` reuses such a file);
2. replay: the single-transition documents are regrouped as a planner with ``k`` runs in flight would
   have sent them — the i-th transition of ``k`` different runs in one call, never two of one run — and
   written, in a scratch database on the stack's server (migrated like the real one, the captured
   leases in place, so nothing is fenced), through one connection. The scratch database is first
   filled with ``--fill`` runs (the captured ones under other ids), so that PostgreSQL plans and
   indexes are those of a database in use, not of empty tables; every measured pass writes the
   captured runs under ids of its own;
3. report, per ``k``: the backend's CPU per transition (``/proc``: the server must run on this machine,
   as ``agentstream dev up``'s does) and the wall time per call (commit and WAL flush included).

Rounds alternate the sizes; medians are reported. Every call must record all its transitions (no
version conflict, nothing fenced), or the benchmark fails. ``--variant FILE`` (repeatable): SQL that
redefines the function (and whatever it needs), measured in the same rounds, alternating with the
migrated one (``current``) — how a change to the history write is tried before it becomes a migration.

    .venv/bin/python -m bench.perf.history_write [--runs 300] [--sizes 1,4,13,50] [--rounds 3] [--fill 20000]
                                            [--variant FILE ...] [--docs FILE] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg

from agentstream.devstack.stack import DevStack
from agentstream.streams.store import migrations
from agentstream.streams.store.history import CAPTURE_ENV
from bench.perf.proc_cpu import cpu_seconds

ROOT = Path(__file__).resolve().parents[2]
SCRATCH = "agentstream_history_bench"
CALL = "SELECT agentstream_record_transitions($1::jsonb)::text"


def capture(runs: int, path: Path) -> None:
    """Run the pipeline benchmark one run at a time with the planner capturing its batch documents."""
    env = {**os.environ, CAPTURE_ENV: str(path)}
    subprocess.run([sys.executable, "-m", "bench.perf.pipeline", "--telemetry", "off", "--concurrency", "1",
                    "--sequential-runs", str(runs)], env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)


def transitions_by_run(path: Path) -> list[list[dict]]:
    """Each captured run's transitions in order, each as a one-transition document."""
    runs: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        if len(doc["new_runs"]) + len(doc["updates"]) != 1:
            continue  # a batch of several (a burst); the regrouping below builds its own
        run = (doc["new_runs"] or doc["updates"])[0]
        runs.setdefault(run["run_id"], []).append(doc)
    return [docs for docs in runs.values() if _whole(docs)]


def _whole(docs: list[dict]) -> bool:
    """Whether ``docs`` are a run's transitions from its start with none missing (each update expects the
    version the one before wrote), so a replay records every one of them."""
    if not docs[0]["new_runs"]:
        return False
    version = docs[0]["new_runs"][0]["version"]
    for doc in docs[1:]:
        if not doc["updates"] or doc["updates"][0]["expected"] != version:
            return False
        version = doc["updates"][0]["version"]
    return True


_IDS = {"new_runs": ("run_id",), "updates": ("run_id",), "leases": ("run_id",),
        "events": ("run_id", "step_id", "event_id", "topic"), "sources": ("run_id", "event_id"),
        "steps_requested": ("run_id", "step_id"), "steps_completed": ("run_id", "step_id")}


def relabel(runs: list[list[dict]], tag: str) -> list[list[dict]]:
    """The same runs under other ids (run, step and event ids, and topics: an event's position is
    unique, all mapped consistently), so that they can be written again next to the originals."""
    def new_id(key: str, value: str | None) -> str | None:
        if value is None:
            return None
        return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{tag}:{value}")) if key == "event_id" else f"{value}~{tag}"

    return [[{part: [{k: new_id(k, v) if k in _IDS.get(part, ()) else v for k, v in row.items()} for row in rows]
              for part, rows in doc.items()} for doc in docs] for docs in runs]


def regroup(runs: list[list[dict]], size: int) -> list[str]:
    """Batches as a planner with ``size`` runs in flight sends them: transition i of ``size`` runs."""
    batches: list[str] = []
    for first in range(0, len(runs), size):
        chunk = runs[first:first + size]
        for i in range(max(len(r) for r in chunk)):
            merged: dict[str, list] = {}
            for r in chunk:
                if i < len(r):
                    for key, rows in r[i].items():
                        merged.setdefault(key, []).extend(rows)
            batches.append(json.dumps(merged))
    return batches


async def create_scratch(database_url: str, leases: set[tuple[str, int, int]], runs: list[list[dict]],
                         copies: int) -> tuple[str, str]:
    """A fresh, migrated scratch database with ``leases`` and ``copies`` copies of ``runs`` written
    (under other ids, 50 transitions a call): its URL, and the migrations' definition of the function
    (to restore it between variants' passes). Dropped again when the benchmark ends."""
    base = database_url.rsplit("/", 1)[0]
    await drop_scratch(database_url)
    admin = await asyncpg.connect(f"{base}/postgres")
    try:
        await admin.execute(f"CREATE DATABASE {SCRATCH}")
    finally:
        await admin.close()
    conn = await asyncpg.connect(f"{base}/{SCRATCH}")
    try:
        await conn.execute("SET client_min_messages = warning")
        await migrations.apply(conn)
        await conn.executemany("INSERT INTO planner_leases (prefix, partition, epoch, owner) VALUES ($1, $2, $3, 'bench')",
                               sorted(leases))
        for i in range(copies):
            for batch in regroup(relabel(runs, f"fill{i}"), 50):
                await conn.fetchval(CALL, batch)
        await conn.execute("VACUUM ANALYZE")
        current: str = await conn.fetchval("SELECT pg_get_functiondef('agentstream_record_transitions'::regproc)")
    finally:
        await conn.close()
    return f"{base}/{SCRATCH}", current


async def replay(url: str, batches: list[str], function_sql: str) -> tuple[float, float]:
    """(backend CPU ms per transition, wall ms per call) writing ``batches`` on a new connection, with
    the function ``function_sql`` defines."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(function_sql)
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        await conn.fetchval(CALL, batches[0])  # plans cached, as on a planner's warm connection
        transitions = sum(len(b["new_runs"]) + len(b["updates"]) for b in map(json.loads, batches[1:]))
        cpu0, t0 = cpu_seconds([pid]), time.perf_counter()
        for batch in batches[1:]:
            result = json.loads(await conn.fetchval(CALL, batch))
            if result["conflicts"] or result["fenced"]:
                raise RuntimeError(f"the replay was refused: {result}")
        cpu1, t1 = cpu_seconds([pid]), time.perf_counter()
        return 1000 * (cpu1 - cpu0) / transitions, 1000 * (t1 - t0) / (len(batches) - 1)
    finally:
        await conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300, help="runs to capture (pipeline at concurrency 1)")
    parser.add_argument("--sizes", default="1,4,13,50", help="transitions per call (runs in flight)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fill", type=int, default=20_000, help="runs written before measuring")
    parser.add_argument("--variant", type=Path, action="append", default=[],
                        help="SQL redefining agentstream_record_transitions, measured against the current one")
    parser.add_argument("--docs", type=Path, help="the captured documents: replayed when the file exists, else captured into it and kept")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    status = DevStack().up()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.docs or Path(tmp) / "history.jsonl"
        if not path.exists():
            capture(args.runs, path)
        runs = transitions_by_run(path)
    if not runs:
        raise SystemExit("no single-transition documents were captured")
    epochs = {(lease["prefix"], lease["partition"], lease["epoch"])
              for docs in runs for doc in docs for lease in doc.get("leases", [])}
    leases = {(prefix, partition, max(e for p, n, e in epochs if (p, n) == (prefix, partition)))
              for prefix, partition, _ in epochs}
    runs = [docs for docs in runs if all((lease["prefix"], lease["partition"], lease["epoch"]) in leases
                                         for doc in docs for lease in doc.get("leases", []))]
    sizes = [int(s) for s in args.sizes.split(",")]
    copies = -(-args.fill // len(runs))
    url, current = asyncio.run(create_scratch(status.database_url, leases, runs, copies))
    functions = {"current": current} | {v.stem: v.read_text() for v in args.variant}
    asyncio.run(replay(url, regroup(relabel(runs, "warm"), 1), current))  # not measured: the cache warms up
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for k in sizes:
            order = list(functions.items())
            for name, sql in order if r % 2 == 0 else reversed(order):  # no function always goes first
                batches = regroup(relabel(runs, f"r{r}k{k}{name}"), k)
                results.setdefault((name, k), []).append(asyncio.run(replay(url, batches, sql)))
    print(f"{len(runs)} runs, {sum(len(r) for r in runs)} transitions captured, replayed after "
          f"{len(runs) * copies} filled; medians of {args.rounds} rounds")
    print(f"  {'function':>16}  {'transitions per call':>20}  {'backend CPU ms/transition':>26}  {'wall ms/call':>13}")
    report: dict[str, dict[str, dict]] = {}
    for (name, k), values in results.items():
        cpu = statistics.median(c for c, _ in values)
        wall = statistics.median(w for _, w in values)
        report.setdefault(name, {})[str(k)] = {"cpu_ms_per_transition": round(cpu, 3),
                                               "wall_ms_per_call": round(wall, 3),
                                               "rounds_cpu": [round(c, 3) for c, _ in values]}
        print(f"  {name:>16}  {k:>20}  {cpu:>26.3f}  {wall:>13.3f}")
    asyncio.run(drop_scratch(status.database_url))
    if args.json:
        print(json.dumps({"runs": len(runs), "functions": report}))


async def drop_scratch(database_url: str) -> None:
    admin = await asyncpg.connect(f"{database_url.rsplit('/', 1)[0]}/postgres")
    try:
        await admin.execute(f"DROP DATABASE IF EXISTS {SCRATCH}")
    finally:
        await admin.close()


if __name__ == "__main__":
    main()
