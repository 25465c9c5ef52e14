"""Chaos suite: several processes of every service, faults while runs are submitted, and then the check
that every run finished exactly once.

On a Kafka + PostgreSQL stack of its own (a temporary state directory, free ports: never the shared dev
stack), the suite starts a scripted model server (services/inference/scripted_server.py) and two worker
processes per service (planner, inference with the ``openai`` backend against that server, tools serving
bench/chaos/chaos_tools.py, retrieval over a few ingested notes), with ``AGENTSTREAM_SESSION_TIMEOUT_MS=6000``.
It submits a steady mix of runs (side effects, retrieval, an approved side effect, slow runs cancelled
mid-way, the calculator), each with a deadline, while the faults of bench/chaos/chaos_faults.py happen:
SIGKILL of every service several times, planners scaled 2→3→2, a planner paused past its session
timeout, PostgreSQL stopped, the broker killed, the model server killed, poison in every input topic.
Then it waits for every run's outcome (until its deadline plus a grace) and checks, from Kafka and
PostgreSQL: nothing lost, nothing stuck, no side effect or event applied twice, no snapshot going back,
no dead letter that is not an injected record's, a reason for every failure. The definitions are in
bench/chaos/chaos_check.py.

    .venv/bin/python -m bench.chaos.chaos [--quick] [--secure] [--json] [--keep] [--skip KIND ...]

``--secure`` runs it where production runs (bench/chaos/chaos_cells.py): three Kafka nodes, SASL/SCRAM and
ACLs, each service as its own principal and login, two tenants; the broker faults then kill one node and,
later, the active controller.

Prints a summary table (and, when a check fails, the tail of every process's log); with ``--json`` the
last line is one JSON object. Exit status: 0 when every check holds, 1 when one fails, 2 when the suite
itself could not run. ``--quick`` (about two minutes in all) shortens the faults and lets them overlap;
``--skip`` leaves out a kind of fault, to tell which one breaks what (a run with a skip is not the suite).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from agentstream.devstack import process
from agentstream.devstack.private import PrivateStack
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.codec import codec_for
from bench.chaos.chaos_cells import (
    TENANTS,
    Cell,
    cells_for,
    client_settings,
    ingest_env,
    make_stack,
    prepare,
    specs,
)
from bench.chaos.chaos_check import Report, build_report, dumps, gather_evidence, merge_reports
from bench.chaos.chaos_faults import (
    FULL,
    MODEL_SERVER,
    QUICK,
    SCALE_PLANNER,
    FaultRecord,
    FaultRunner,
    FaultStep,
    Timings,
    build_plan,
    plan_length_s,
)
from bench.chaos.chaos_load import CHAOS_AGENTS, REQUEST_TIMEOUT_S, Load, OutcomeLog, run_kinds
from bench.chaos.chaos_poison import inject
from bench.chaos.chaos_procs import FOREIGN_ENV, SuiteError, Supervisor, groups_ready, model_ready
from bench.chaos.chaos_report import logs_dir, print_summary, print_tails

SESSION_TIMEOUT_MS = 6000
#: The baseline runs (one of each kind but the cancelled one, before any fault) must end within this.
BASELINE_TIMEOUT_S = 60.0
#: After every run has an outcome: how long to keep watching for a late duplicate before stopping.
SETTLE_S = 3.0
STOP_GRACE_S = 15.0
OUTCOME_POLL_S = 1.0
#: Reading the topics and tables back at the end (the stack is up again by then; more is a hang).
EVIDENCE_TIMEOUT_S = 120.0
NOTES = {
    "kafka.md": "# Kafka partitions\n\nEvery event of a run carries the run id as its key, so Kafka partitions "
                "keep a run's events in order and the same planner instance sees all of them.\n",
    "postgres.md": "# PostgreSQL history\n\nThe planner records each transition in PostgreSQL: the run's state, "
                   "its steps and every event once, so a run can be replayed after a crash.\n",
}


@dataclass(frozen=True)
class Mode:
    """What one mode of the suite does; the CLI's options override the durations and counts."""

    name: str
    duration_s: float  # of the submission phase (stretched to cover the fault plan)
    runs: int
    deadline_s: float
    grace_s: float
    timings: Timings
    #: Load after the last fault, so its recovery can be measured.
    tail_s: float
    cancel_slow_ms: int = 4000
    cancel_after_s: float = 1.0


MODES = {
    # 2 runs/s for as long as the faults take (FULL's plan ends at ~245 s) and a tail to measure recovery.
    "full": Mode("full", duration_s=260, runs=520, deadline_s=240, grace_s=30, timings=FULL, tail_s=15),
    # 4 runs/s over QUICK's overlapping plan (~32 s); a deadline that the overlapping outages leave room for.
    "quick": Mode("quick", duration_s=36, runs=144, deadline_s=45, grace_s=15, timings=QUICK, tail_s=4),
}


# -- set-up -------------------------------------------------------------------------------------------
def write_notes(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in NOTES.items():
        (directory / name).write_text(text)


async def ingest_notes(stack: PrivateStack, directory: Path) -> None:
    """``agentstream ingest`` of a few notes, so retrieval has something to find."""
    await asyncio.to_thread(write_notes, directory)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentstream.cli", "ingest", str(directory), "--json",
        env=ingest_env(stack), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise SuiteError(f"agentstream ingest failed:\n{out.decode(errors='replace')[-2000:]}")


async def wait_until(done: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> bool:
    """Poll ``done`` (state another task updates) until it holds or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        if done():
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(poll_s)


async def baseline(load: Load, outlog: OutcomeLog) -> dict[str, str]:
    """One run of each kind that needs no cancel, before any fault: does the pipeline work at all? The
    runs are then taken out of the load (they are not part of the verdict)."""
    probes = [await load.submit_one(k) for k in load.kinds if k.cancel_after_s is None]
    await wait_until(lambda: all(r.run_id in outlog.first for r in probes if r), BASELINE_TIMEOUT_S)
    result = {}
    for run in filter(None, probes):
        load.runs.pop(run.run_id, None)
        o = outlog.first.get(run.run_id)
        result[run.kind.name] = "none" if o is None else o.status + (f":{o.error_code}" if o.error_code else "")
    if all(v == "none" for v in result.values()):
        raise SuiteError(f"no baseline run ended within {BASELINE_TIMEOUT_S:.0f} s: {result}")
    return result


async def wait_for_outcomes(load: Load, outlog: OutcomeLog, database_url: str, grace_s: float) -> None:
    """Until every run has an outcome (the topic or the table), or every deadline + grace has passed."""
    runs = list(load.runs.values())
    until = max((r.deadline for r in runs), default=time.time()) + grace_s
    ended: set[str] = set()
    while time.time() < until:
        pending = [r.run_id for r in runs if r.run_id not in outlog.first and r.run_id not in ended]
        if not pending:
            return
        with contextlib.suppress(Exception):
            conn = await asyncpg.connect(database_url, timeout=REQUEST_TIMEOUT_S)
            try:
                rows = await conn.fetch("SELECT run_id FROM runs WHERE run_id = ANY($1) AND status IN "
                                        "('completed', 'failed')", pending)
                ended.update(r["run_id"] for r in rows)
            finally:
                await conn.close()
        await asyncio.sleep(OUTCOME_POLL_S)


@dataclass
class CellLoad:
    """One cell's side of the suite: its clients, load and live view of outcomes."""

    cell: Cell
    client: AgentClient
    load: Load
    outlog: OutcomeLog
    count: int = 0


class Suite:
    """One run of the suite on its stack: start the processes, load and faults, verdict, stop."""

    def __init__(self, stack: PrivateStack, mode: Mode, args: argparse.Namespace, workdir: Path) -> None:
        self.stack, self.mode, self.args, self.workdir = stack, mode, args, workdir
        self.settings = dataclasses.replace(Settings.load(stack.paths), topic_prefix="",
                                            session_timeout_ms=SESSION_TIMEOUT_MS)
        self.codec = codec_for(self.settings)
        #: The checker's Kafka identity: the administrator on a secure stack (it reads every cell's topics).
        self.auth = stack.auth()
        self.cells = cells_for(args.secure)
        self.model_port = process.free_port()
        self.sup = Supervisor()
        extra = {"AGENTSTREAM_SESSION_TIMEOUT_MS": str(SESSION_TIMEOUT_MS)}
        for spec in specs(stack, self.cells, logs_dir(stack), self.model_port, extra):
            self.sup.add(spec)
        self.stop = asyncio.Event()
        self.background: list[asyncio.Task] = []
        self.grace_s = args.grace or mode.grace_s
        self.deadline_s = args.deadline or mode.deadline_s

    async def run(self) -> dict:
        try:
            await self.start_processes()
            return await self.load_and_check()
        finally:
            self.stop.set()
            for task in self.background:
                task.cancel()
            await asyncio.gather(*self.background, return_exceptions=True)
            await self.sup.stop_all(STOP_GRACE_S)

    async def start_processes(self) -> None:
        await prepare(self.stack, self.cells)
        self.sup.start(MODEL_SERVER)
        await ingest_notes(self.stack, self.workdir / "notes")
        await model_ready(self.model_port)
        for name in self.sup.slots:
            if name not in (MODEL_SERVER, SCALE_PLANNER):
                self.sup.start(name)
        self.background.append(asyncio.create_task(self.sup.watch(self.stop)))
        groups = {g: n for cell in self.cells for g, n in cell.groups().items()}
        await groups_ready(self.stack.bootstrap, groups, self.sup, self.auth)

    def _plan(self) -> tuple[list[FaultStep], float, int]:
        plan = [s for s in build_plan(self.mode.timings, self.stack.cluster.size) if s.kind not in self.args.skip]
        needed = plan_length_s(plan, self.mode.timings) + self.mode.tail_s if plan else 0.0
        duration = max(self.args.duration or self.mode.duration_s, needed)
        count = self.args.runs or round(self.mode.runs * duration / self.mode.duration_s)
        return plan, duration, count

    async def _open_cell(self, exits: contextlib.AsyncExitStack, cell: Cell, kinds: list, count: int) -> CellLoad:
        submit, approve = client_settings(self.stack, cell, self.settings)
        client = await exits.enter_async_context(AgentClient(submit))
        approver = await exits.enter_async_context(AgentClient(approve)) if approve is not None else None
        outlog = OutcomeLog(self.stack.bootstrap, client.topics.outcomes, submit.partitions, self.codec, self.auth)
        self.background.append(asyncio.create_task(outlog.follow(self.stop)))
        await client.agents.register(*CHAOS_AGENTS)  # the tree kind's agents
        load = Load(client, kinds, self.deadline_s, self.args.seed + len(cell.prefix), approver=approver)
        return CellLoad(cell, client, load, outlog, max(1, round(count * cell.share)))

    async def load_and_check(self) -> dict:
        plan, duration, count = self._plan()
        kinds = run_kinds(self.mode.cancel_slow_ms, self.mode.cancel_after_s)
        async with contextlib.AsyncExitStack() as exits:
            cells = [await self._open_cell(exits, cell, kinds, count) for cell in self.cells]
            primary = cells[0]
            approver_stop = asyncio.Event()
            for c in cells:
                self.background.append(asyncio.create_task(c.load.approve_until(approver_stop)))
            bases = await asyncio.gather(*(baseline(c.load, c.outlog) for c in cells))
            faults = FaultRunner(self.stack, self.sup, lambda: self._poison(primary.client),
                                 lambda: model_ready(self.model_port), STOP_GRACE_S)
            started, origin = time.time(), time.monotonic()
            fault_task = asyncio.create_task(faults.run(plan, origin))
            await asyncio.gather(*(c.load.submit_for(duration, c.count) for c in cells))
            submitted_s = time.monotonic() - origin
            await fault_task
            for c in cells:
                await c.load.drain()
            await asyncio.gather(*(wait_for_outcomes(c.load, c.outlog, self.stack.database_url, self.grace_s)
                                   for c in cells))
            await asyncio.sleep(SETTLE_S)
            approver_stop.set()
            self.stop.set()
            await self.sup.stop_all(STOP_GRACE_S)
            injected = [i for f in faults.records for i in f.detail.pop("injected", [])]
            reports = [await self._verdict(c, injected if c is primary else [], faults.records) for c in cells]
        phase = {"started": started, "submitted_s": submitted_s, "duration": duration, "count": count}
        base = bases[0] if len(cells) == 1 else {c.cell.label: b for c, b in zip(cells, bases, strict=True)}
        return self.assemble(merge_reports([(c.cell.label, r) for c, r in zip(cells, reports, strict=True)]),
                             faults.records, [c.load for c in cells], base, phase)

    async def _verdict(self, cell: CellLoad, injected: list, faults: list[FaultRecord]) -> Report:
        """Read ``cell``'s topics and tables back (as the administrator and the schema's owner) and judge."""
        runs = list(cell.load.runs.values())
        try:
            evidence = await asyncio.wait_for(gather_evidence(
                self.stack.bootstrap, self.stack.database_url, cell.client.topics, self.codec,
                [r.run_id for r in runs], self.auth), EVIDENCE_TIMEOUT_S)
        except TimeoutError as exc:
            raise SuiteError(f"reading the evidence back took over {EVIDENCE_TIMEOUT_S:.0f} s") from exc
        seen = {run_id: o.seen for run_id, o in cell.outlog.first.items()}
        return build_report(runs, evidence, injected, faults, self.grace_s, seen)

    async def _poison(self, client: AgentClient) -> dict:
        injected = await inject(self.stack.bootstrap, client.topics, self.codec, self.auth)
        return {"injected": injected, "records": len(injected)}

    def assemble(self, report: Report, faults: list[FaultRecord], loads: list[Load], base: dict, phase: dict) -> dict:
        """The JSON object: the counts first, then the evidence behind them."""
        c, started = report.counts, phase["started"]
        invariants_hold = (c["lost"] == c["stuck"] == c["duplicated_effects"] == c["duplicated_events"]
                           == c["snapshot_regressions"] == c["dead_letters"] == c["failed_without_reason"]
                           == c["session_violations"] == c["tree_violations"] == 0)
        fault_errors = [f"{f.label}: {f.error}" for f in faults if f.error]
        ordered = sorted(faults, key=lambda f: f.started)
        during = report.details.pop("completed_during_fault")
        timeline = [{"fault": f.label, "planned_s": f.planned_s, "start_s": round(f.started - started, 2),
                     "end_s": None if f.ended is None else round(f.ended - started, 2),
                     "completed_during": n, "error": f.error, **f.detail} for f, n in zip(ordered, during, strict=True)]
        stats = [dataclasses.asdict(load.stats) for load in loads]
        return {
            **c, **report.details,
            "faults": timeline, "fault_errors": fault_errors,
            "ok": invariants_hold and not fault_errors and not self.args.skip,
            "mode": self.mode.name, "stack": stack_label(self.stack), "skipped_faults": sorted(self.args.skip),
            "baseline": base,
            "load": {"submitted": sum(len(load.runs) for load in loads), "planned": phase["count"],
                     "submit_phase_s": round(phase["submitted_s"], 1), "planned_duration_s": round(phase["duration"], 1),
                     "deadline_s": self.deadline_s, "grace_s": self.grace_s, "session_timeout_ms": SESSION_TIMEOUT_MS,
                     **{k: sum(s[k] for s in stats) for k in stats[0]}},
            "worker_exits": [{"process": e.name, "returncode": e.returncode, "at_s": round(e.at - started, 1),
                              "uptime_s": e.uptime_s, "during": _active(ordered, e.at),
                              "log_tail": e.tail.splitlines()[-8:]} for e in self.sup.exits],
            "restarts": dict(self.sup.restarts),
        }


def stack_label(stack: PrivateStack) -> str:
    nodes = f"{stack.cluster.size} Kafka node{'s' if stack.cluster.size > 1 else ''}"
    return f"secure, {nodes}, tenants {', '.join(TENANTS)}" if stack.secrets is not None else f"default, {nodes}"


def _active(faults: list[FaultRecord], at: float) -> list[str]:
    """The faults under way at ``at`` (a worker that exits while PostgreSQL is down is another story
    than one that exits on a quiet system)."""
    return [f.label for f in faults if f.started <= at <= (f.ended or at)]


# -- output -------------------------------------------------------------------------------------------
# -- entry point ----------------------------------------------------------------------------------------
def keep_logs(logs: Path) -> Path:
    """Copy the processes' logs out of the state directory about to be deleted (a few MB, unlike the
    broker's and database's data)."""
    target = Path(tempfile.mkdtemp(prefix="agentstream-chaos-logs-"))
    shutil.copytree(logs, target, dirs_exist_ok=True)
    return target


def log_to_file(path: Path) -> None:
    """The suite's own clients log every connection the faults break (hundreds of lines per broker kill):
    into a file next to the workers' logs, so the console keeps the summary and the JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=path, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short faults, overlapping (about 2 minutes)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    parser.add_argument("--duration", type=float, help="seconds of submitting (default: per mode)")
    parser.add_argument("--runs", type=int, help="runs to submit (default: per mode)")
    parser.add_argument("--deadline", type=float, help="each run's deadline, seconds after its submit")
    parser.add_argument("--grace", type=float, help="seconds past a deadline before a run counts as stuck")
    parser.add_argument("--seed", type=int, default=7, help="of the run mix")
    parser.add_argument("--skip", action="append", default=[], metavar="KIND",
                        help="leave out a kind of fault (sigkill, scale_up, scale_down, pause, postgres_outage, "
                             "broker_kill, model_outage, poison); repeatable; the result is then not 'ok'")
    parser.add_argument("--keep", action="store_true", help="keep the logs and the stack's data afterwards")
    parser.add_argument("--secure", action="store_true",
                        help="where production runs: three Kafka nodes, SASL/SCRAM and ACLs, each service as its own "
                             "principal and login, two tenants (bench/chaos/chaos_cells.py)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.skip = set(args.skip)
    mode = MODES["quick" if args.quick else "full"]
    for name in FOREIGN_ENV:  # this process must resolve nothing to another stack
        os.environ.pop(name, None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(2))  # unwind through the finally blocks below
    workdir = Path(tempfile.mkdtemp(prefix="agentstream-chaos-"))
    stack: PrivateStack | None = None
    result: dict | None = None
    try:
        stack = make_stack(workdir / "state", args.secure)
        log_to_file(logs_dir(stack) / "suite.log")
        # Settings.load() in this process resolves to the suite's stack (not KAFKA_BOOTSTRAP_SERVERS /
        # DATABASE_URL: those would make `dev up` treat the stack as someone else's and not start it).
        os.environ.update({k: v for k, v in stack.env().items() if k.startswith("AGENTSTREAM_")})
        started = time.monotonic()
        asyncio.run(stack.start())
        result = asyncio.run(Suite(stack, mode, args, workdir).run())
        result["elapsed_s"] = round(time.monotonic() - started, 1)
        print_summary(result)
    except Exception as exc:  # SuiteError, or a bug of the suite's own: reported as such, never as a finding
        detail = str(exc) if isinstance(exc, SuiteError) else traceback.format_exc()
        print(f"chaos suite could not run: {detail}")
        result = {"ok": False, "suite_error": detail, "mode": mode.name}
    finally:
        if result is None or not result["ok"]:
            print_tails(stack)
        if stack is not None:
            with contextlib.suppress(Exception):
                asyncio.run(stack.close(keep_data=args.keep))
        if args.keep:
            print(f"logs in {workdir / 'state' / 'logs'}; to look at the stack's data: "
                  f"AGENTSTREAM_STATE_DIR={workdir / 'state'} agentstream dev up")
        else:
            if stack is not None and (result is None or not result["ok"]):
                print(f"logs kept in {keep_logs(logs_dir(stack))}")  # a failure must stay explainable
            shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(dumps(result))
    sys.exit(2 if "suite_error" in result else 0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
