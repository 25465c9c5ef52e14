"""The chaos suite's verdict: every run's outcome and every invariant, from Kafka *and* PostgreSQL.

Sources, read after the workers have stopped: ``agent.outcomes``, ``agent.runs`` and ``agent.dlq`` from
their beginning (the suite's stack is its own, so every record is the suite's), and in PostgreSQL the
``runs`` rows, the ``events`` history and the side-effect table ``chaos_effects``. Definitions (the JSON
keys of ``bench/chaos/chaos.py``):

- **outcome** of a run: its first ``RunCompleted``/``RunFailed`` on ``agent.outcomes`` (offset order), or
  else a terminal ``runs`` row. Its *time* is when the suite's follower of the topic read it, which is
  when a waiting client could know (the record's own timestamp is when a producer made it, which can be
  long before it reached the broker: a producer holds records while the broker is down); without the
  follower's time, the record's timestamp; for a row alone, ``finished_at``;
- **lost**: no outcome in either source by the end of the wait;
- **stuck**: not lost, and either no outcome on ``agent.outcomes`` at all (only the row says it ended, so
  a client waiting on the topic never hears), or the first one was sent later than deadline + grace;
- **duplicated_effects**: rows of ``chaos_effects`` beyond one per ``(run_id, step_id)``: a side-effect
  tool that ran twice for one step;
- **duplicated_events**: the sum of (a) per run, distinct outcomes on ``agent.outcomes`` beyond the first
  (distinct by type and error code: a republished copy of the same outcome is not counted); (b) runs
  whose ``runs`` row ended differently (status or error code) from their first outcome on the topic;
  (c) per ``(run_id, step_id, event_type)`` in the ``events`` history, rows beyond one (``event_id`` is
  unique there, so a second row is a second, different event of that type for one step: a step
  requested, answered or applied twice); (d) per run and snapshot version on ``agent.runs``, distinct
  ``(status, step_index)`` beyond one (two planners each moving the run to the same version);
- **snapshot_regressions**: snapshots on ``agent.runs`` whose version is lower than one published before
  them (offset order) for the same run;
- **dead_letters**: letters on ``agent.dlq`` whose source (topic, partition, offset) is not an injected
  poison record and whose run is not a poison run (letters about records *derived* from poison, e.g.
  a request the planner built from a poison task, are listed apart as ``poison_derived_dead_letters``);
- **tree_violations**: runs of the ``tree`` kind that completed without exactly one completed child per
  sub-agent step (each with its side effect), plus parent steps with more than one child run;
- **session_violations**: sessions (the ``session`` kind's conversations) whose transcript is not exactly
  their completed turns, each once, in their order on the session's partition (the oldest beyond the
  token budget dropped): a turn lost, applied twice or reordered;
- **recovery_s** of a fault: from its end to the first completion of a suite run read after it (with
  overlapping faults, as in ``--quick``, it runs to the end of the whole overlapping stretch).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import DeadLetter, RunCompleted, RunFailed, RunStateSnapshot
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.topics import Topics
from bench.chaos.chaos_faults import FaultRecord
from bench.chaos.chaos_load import SubmittedRun
from bench.chaos.chaos_poison import POISON_PREFIX, Injected
from bench.chaos.chaos_tools import EFFECTS_TABLE

#: Letters, runs and examples listed in the report at most (the counts are always complete).
LIST_LIMIT = 25
REASON_CHARS = 300
#: Fetch size for reading back topics that may hold multi-megabyte records.
FETCH_BYTES = 16 * 1024 * 1024


@dataclass
class TopicRecord:
    partition: int
    offset: int
    timestamp: float
    key: bytes | None
    event: Any  # the decoded event, or None when it does not decode


async def read_topic(bootstrap: str, topic: str, partitions: int, codec: Codec,
                     auth: KafkaAuth | None = None) -> list[TopicRecord]:
    """Every record of ``topic`` up to its end offsets now, decoded, in (partition, offset) order."""
    consumer = AIOKafkaConsumer(**kafka_options(bootstrap, auth or KafkaAuth()), enable_auto_commit=False,
                                isolation_level="read_committed", max_partition_fetch_bytes=FETCH_BYTES,
                                fetch_max_bytes=FETCH_BYTES)
    await consumer.start()
    out: list[TopicRecord] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for messages in batch.values():
                for msg in messages:
                    out.append(TopicRecord(msg.partition, msg.offset, msg.timestamp / 1000, msg.key,
                                           _decode(codec, msg.value)))
            remaining = {tp for tp in remaining if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    out.sort(key=lambda r: (r.partition, r.offset))
    return out


def _decode(codec: Codec, value: bytes | None) -> Any:
    try:
        return codec.decode(value)
    except DecodeError:
        return None


@dataclass
class Evidence:
    outcomes: list[TopicRecord]
    snapshots: list[TopicRecord]
    letters: list[TopicRecord]
    rows: dict[str, asyncpg.Record]
    effects: list[asyncpg.Record]
    event_dupes: list[asyncpg.Record]
    history_rows: int = 0  # rows of the events history for the suite's runs (the dupes' denominator)
    #: Each session's transcript (run ids, oldest first) and turns dropped for its budget; each turn's place.
    sessions: dict[str, tuple[list[str], int]] = field(default_factory=dict)
    seqs: dict[str, int] = field(default_factory=dict)
    #: Sub-agents' runs of the suite's runs (the ``tree`` kind): run id, status, parent, parent's step.
    children: list[asyncpg.Record] = field(default_factory=list)


async def gather_evidence(bootstrap: str, database_url: str, topics: Topics, codec: Codec,
                          run_ids: list[str], auth: KafkaAuth | None = None) -> Evidence:
    partitions = {s.name: s.partitions for s in topics.specs()}
    outcomes, snapshots, letters = await asyncio.gather(
        *(read_topic(bootstrap, t, partitions[t], codec, auth) for t in (topics.outcomes, topics.runs, topics.dlq)))
    conn = await asyncpg.connect(database_url)
    try:
        children = await conn.fetch(
            "SELECT run_id, status, state->>'parent_run_id' AS parent, state->>'parent_step_id' AS step FROM runs "
            "WHERE state->>'parent_run_id' = ANY($1)", run_ids)
        run_ids = [*run_ids, *(c["run_id"] for c in children)]  # their effects and events are judged too
        rows = {r["run_id"]: r for r in await conn.fetch(
            "SELECT run_id, status, error_code, error, finished_at, version FROM runs WHERE run_id = ANY($1)",
            run_ids)}
        effects = await conn.fetch(
            f"SELECT run_id, step_id, count(*) AS n FROM {EFFECTS_TABLE} WHERE run_id = ANY($1) "
            "GROUP BY run_id, step_id", run_ids)
        event_dupes = await conn.fetch(
            "SELECT run_id, step_id, event_type, count(*) AS n FROM events WHERE run_id = ANY($1) "
            "GROUP BY run_id, step_id, event_type HAVING count(*) > 1", run_ids)
        history_rows = await conn.fetchval("SELECT count(*) FROM events WHERE run_id = ANY($1)", run_ids)
        sessions = {r["session_id"]: ([t["run_id"] for t in json.loads(r["turns"])], r["dropped"]) for r in await conn.fetch(
            "SELECT session_id, turns::text AS turns, dropped FROM sessions WHERE prefix = $1", topics.prefix)}
        seqs = {r["run_id"]: r["seq"] for r in await conn.fetch(
            "SELECT run_id, coalesce((state->>'session_seq')::bigint, 0) AS seq FROM runs WHERE run_id = ANY($1) "
            "AND state ? 'session'", run_ids)}
    finally:
        await conn.close()
    return Evidence(outcomes, snapshots, letters, rows, effects, event_dupes, history_rows, sessions, seqs, children)


@dataclass
class RunVerdict:
    run: SubmittedRun
    status: str | None = None  # completed | failed | None (lost)
    error_code: str | None = None
    error: str | None = None
    at: float | None = None  # the outcome's time (see the module docstring)
    on_topic: bool = False
    in_table: bool = False


@dataclass
class Report:
    """Everything ``bench/chaos/chaos.py`` prints and puts in its JSON."""

    counts: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


def _first_outcomes(evidence: Evidence) -> tuple[dict[str, TopicRecord], dict[str, set[tuple[str, str]]]]:
    first: dict[str, TopicRecord] = {}
    distinct: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for rec in evidence.outcomes:
        event = rec.event
        if isinstance(event, (RunCompleted, RunFailed)):
            first.setdefault(event.run_id, rec)
            distinct[event.run_id].add((type(event).__name__, getattr(event, "error_code", "") or ""))
    return first, distinct


def judge_runs(runs: list[SubmittedRun], evidence: Evidence,
               seen: dict[str, float]) -> tuple[list[RunVerdict], dict[str, Any]]:
    """Each run's outcome, and the outcome-level duplicates: (a) and (b) of ``duplicated_events``.
    ``seen``: when the suite's follower read each run's first outcome."""
    first, distinct = _first_outcomes(evidence)
    verdicts: list[RunVerdict] = []
    dup_outcomes, disagreements = [], []
    for run in runs:
        v = RunVerdict(run)
        rec, row = first.get(run.run_id), evidence.rows.get(run.run_id)
        if row is not None and row["status"] in ("completed", "failed"):
            v.in_table = True
            v.status, v.error_code, v.error = row["status"], row["error_code"], row["error"]
            v.at = row["finished_at"].timestamp() if row["finished_at"] else None
        if rec is not None:
            event = rec.event
            v.on_topic, v.at = True, seen.get(run.run_id, rec.timestamp)
            topic_status = "completed" if isinstance(event, RunCompleted) else "failed"
            topic_code = getattr(event, "error_code", None)
            if v.in_table and (v.status, v.error_code or None) != (topic_status, topic_code or None):
                disagreements.append({"run_id": run.run_id, "topic": [topic_status, topic_code],
                                      "table": [v.status, v.error_code]})
            v.status, v.error_code = topic_status, topic_code
            if isinstance(event, RunFailed):
                v.error = event.error
        if len(distinct.get(run.run_id, ())) > 1:
            dup_outcomes.append({"run_id": run.run_id, "outcomes": sorted(distinct[run.run_id])})
        verdicts.append(v)
    extra = sum(len(d["outcomes"]) - 1 for d in dup_outcomes)
    return verdicts, {"outcomes": extra, "outcome_disagreements": len(disagreements),
                      "examples": (dup_outcomes + disagreements)[:LIST_LIMIT]}


def snapshot_checks(evidence: Evidence, run_ids: set[str]) -> tuple[int, int, list[dict]]:
    """(regressions, forks, examples) over ``agent.runs`` in offset order, per run."""
    top: dict[str, int] = {}
    seen: dict[tuple[str, int], set[tuple[str, int]]] = defaultdict(set)
    regressions, examples = 0, []
    for rec in evidence.snapshots:
        snap = rec.event
        if not isinstance(snap, RunStateSnapshot) or snap.run_id not in run_ids:
            continue
        if snap.version < top.get(snap.run_id, -1):
            regressions += 1
            if len(examples) < LIST_LIMIT:
                examples.append({"run_id": snap.run_id, "partition": rec.partition, "offset": rec.offset,
                                 "version": snap.version, "after_version": top[snap.run_id]})
        top[snap.run_id] = max(top.get(snap.run_id, -1), snap.version)
        seen[(snap.run_id, snap.version)].add((snap.status, snap.step_index))
    forks = sum(len(states) - 1 for states in seen.values())
    return regressions, forks, examples


def effect_checks(runs: list[SubmittedRun], verdicts: list[RunVerdict], evidence: Evidence) -> dict[str, Any]:
    """Duplicated effects (an invariant) and missing ones (allowed: an interrupted call may not have
    happened, docs/architecture.md "Delivery guarantees"; reported for information)."""
    per_run: Counter = Counter()
    duplicated, examples = 0, []
    for row in evidence.effects:
        per_run[row["run_id"]] += 1
        if row["n"] > 1:
            duplicated += row["n"] - 1
            if len(examples) < LIST_LIMIT:
                examples.append({"run_id": row["run_id"], "step_id": row["step_id"], "rows": row["n"]})
    missing = sum(1 for v in verdicts if v.status == "completed" and per_run[v.run.run_id] < v.run.kind.effects)
    return {"duplicated": duplicated, "examples": examples, "completed_runs_missing_effects": missing}


def session_checks(verdicts: list[RunVerdict], evidence: Evidence) -> dict[str, Any]:
    """Each session's transcript against its turns: every completed turn in it once, none that did not
    complete, in their order on the session's partition (``session_seq``; the oldest beyond the token
    budget dropped). A violation is a turn lost, doubled or reordered across the faults."""
    completed: dict[str, list[str]] = defaultdict(list)
    for v in verdicts:
        if v.run.session is not None and v.status == "completed":
            completed[v.run.session].append(v.run.run_id)
    known = {v.run.run_id for v in verdicts}
    violations = []
    for session, turns in completed.items():
        expected = sorted(turns, key=lambda r: evidence.seqs.get(r, -1))
        transcript, dropped = evidence.sessions.get(session, ([], 0))
        kept = [r for r in transcript if r in known]  # the baseline's turn (not judged) may be there too
        if (len(set(transcript)) != len(transcript) or kept != expected[len(expected) - len(kept):]
                or (dropped == 0 and len(kept) != len(expected))):
            violations.append({"session": session, "transcript": transcript, "dropped": dropped,
                               "completed": expected})
    return {"sessions": len(completed), "turns": sum(len(t) for t in completed.values()),
            "violations": len(violations), "examples": violations[:LIST_LIMIT]}


def tree_checks(verdicts: list[RunVerdict], evidence: Evidence) -> dict[str, Any]:
    """The ``tree`` kind's runs against their sub-agents: a completed parent has exactly one child per
    sub-agent step (two), each completed; no parent step has two children. A violation is a child lost,
    started twice or unfinished under a parent that answered. A completed child without its side effect is
    counted apart (``children_missing_effects``), as ``completed_runs_missing_effects`` is for the other
    kinds: a tool call cut off mid-way (its worker killed while the database was down) is answered
    "interrupted" and not run again (at most once), and the child's model answers all the same."""
    by_parent: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for child in evidence.children:
        by_parent[child["parent"]].append(child)
    effects = Counter(r["run_id"] for r in evidence.effects)
    violations = []
    missing = 0
    twice = sum(n - 1 for n in Counter((c["parent"], c["step"]) for c in evidence.children).values() if n > 1)
    for v in verdicts:
        if v.run.kind.agent is None or v.status != "completed":
            continue
        kids = by_parent.get(v.run.run_id, [])
        missing += sum(1 for k in kids if k["status"] == "completed" and effects[k["run_id"]] < 1)
        if len(kids) != 2 or any(k["status"] != "completed" for k in kids):
            violations.append({"run_id": v.run.run_id, "children": [(k["run_id"], k["status"], effects[k["run_id"]])
                                                                    for k in kids]})
    return {"trees": sum(1 for v in verdicts if v.run.kind.agent is not None), "children": len(evidence.children),
            "children_started_twice": twice, "children_missing_effects": missing,
            "violations": len(violations) + twice, "examples": violations[:LIST_LIMIT]}


def letter_checks(evidence: Evidence, injected: list[Injected]) -> dict[str, Any]:
    """Sort the dead letters: of an injected record, derived from poison, or of real traffic. Each
    injected record's fate: its dead letters, and the outcome of the run it named, if one started."""
    first, _ = _first_outcomes(evidence)
    sources = {i.source: i for i in injected}
    of_injected: dict[tuple[str, int, int], list[dict]] = defaultdict(list)
    derived, real = [], []
    for rec in evidence.letters:
        letter = rec.event
        if not isinstance(letter, DeadLetter):
            real.append({"offset": rec.offset, "error_kind": "undecodable_letter", "reason": "not a DeadLetter"})
            continue
        info = {"consumer": letter.consumer, "source": f"{letter.source_topic}[{letter.source_partition}]"
                f"@{letter.source_offset}", "run_id": letter.run_id, "error_kind": letter.error_kind,
                "reason": letter.reason[:REASON_CHARS], "truncated": getattr(letter, "truncated", None)}
        key = (letter.source_topic, letter.source_partition, letter.source_offset)
        if key in sources:
            of_injected[key].append(info)
        elif letter.run_id.startswith(POISON_PREFIX):
            derived.append(info)
        else:
            real.append(info)
    fates = [{**i.public(), "run_outcome": _outcome_label(first.get(i.run_id)),
              "dead_letters": [{k: v for k, v in d.items() if k in ("consumer", "error_kind", "reason")}
                               for d in of_injected.get(i.source, [])]} for i in injected]
    return {"real": real, "derived": derived, "injected": fates}


def _outcome_label(rec: TopicRecord | None) -> str | None:
    if rec is None:
        return None
    return "completed" if isinstance(rec.event, RunCompleted) else f"failed:{rec.event.error_code}"


def recovery(faults: list[FaultRecord], verdicts: list[RunVerdict]) -> tuple[dict[str, float | None], list[int]]:
    """Per fault (in start order): seconds from its end to the first completion of a suite run read after
    it, and how many suite runs completed while it lasted."""
    completions = sorted(v.at for v in verdicts if v.status == "completed" and v.on_topic and v.at is not None)
    out: dict[str, float | None] = {}
    during: list[int] = []
    for n, fault in enumerate(sorted(faults, key=lambda f: f.started), 1):
        end = fault.ended
        after = next((t for t in completions if end is not None and t >= end), None)
        out[f"{n:02d} {fault.label}"] = None if after is None or end is None else round(after - end, 2)
        during.append(sum(1 for t in completions if fault.started <= t <= (end or fault.started)))
    return out, during


def build_report(runs: list[SubmittedRun], evidence: Evidence, injected: list[Injected],
                 faults: list[FaultRecord], grace_s: float, seen: dict[str, float]) -> Report:
    verdicts, outcome_dupes = judge_runs(runs, evidence, seen)
    recovery_s, completed_during = recovery(faults, verdicts)
    run_ids = {r.run_id for r in runs}
    regressions, forks, regression_examples = snapshot_checks(evidence, run_ids)
    effects = effect_checks(runs, verdicts, evidence)
    letters = letter_checks(evidence, injected)
    conversations = session_checks(verdicts, evidence)
    trees = tree_checks(verdicts, evidence)
    step_dupes = sum(r["n"] - 1 for r in evidence.event_dupes)
    lost = [v for v in verdicts if v.status is None]
    stuck = [v for v in verdicts if v.status is not None and (not v.on_topic or (v.at or 0) > v.run.deadline + grace_s)]
    failed = [v for v in verdicts if v.status == "failed"]
    unexpected = [v for v in verdicts if v.status is not None and _label(v) != v.run.kind.expect]
    report = Report()
    report.counts = {
        "runs": len(runs),
        "completed": sum(1 for v in verdicts if v.status == "completed"),
        "failed_by": dict(Counter(v.error_code or "(none)" for v in failed)),
        "lost": len(lost),
        "stuck": len(stuck),
        "duplicated_effects": effects["duplicated"],
        "duplicated_events": outcome_dupes["outcomes"] + outcome_dupes["outcome_disagreements"] + step_dupes + forks,
        "snapshot_regressions": regressions,
        "dead_letters": len(letters["real"]),
        "failed_without_reason": sum(1 for v in failed if not (v.error_code and v.error)),
        "session_violations": conversations["violations"],
        "tree_violations": trees["violations"],
    }
    report.details = {
        "duplicated_events_detail": {"outcomes": outcome_dupes["outcomes"],
                                     "outcome_disagreements": outcome_dupes["outcome_disagreements"],
                                     "steps": step_dupes, "snapshot_forks": forks,
                                     "examples": outcome_dupes["examples"] + [
                                         {k: r[k] for k in ("run_id", "step_id", "event_type", "n")}
                                         for r in evidence.event_dupes[:LIST_LIMIT]]},
        "sessions": {k: conversations[k] for k in ("sessions", "turns", "examples")},
        "trees": {k: trees[k] for k in ("trees", "children", "children_started_twice", "children_missing_effects", "examples")},
        "dead_letter_reasons": letters["real"][:LIST_LIMIT],
        "dead_letters_by_kind": dict(Counter(f"{d['consumer']}:{d['error_kind']}" for d in letters["real"])),
        "poison_derived_dead_letters": letters["derived"][:LIST_LIMIT],
        "injected": letters["injected"],
        "recovery_s": recovery_s,
        "completed_during_fault": completed_during,
        "by_kind": _by_kind(verdicts),
        "unexpected_outcomes": [_brief(v) for v in unexpected[:LIST_LIMIT]],
        "lost_runs": [_brief(v) for v in lost[:LIST_LIMIT]],
        "stuck_runs": [_brief(v) for v in stuck[:LIST_LIMIT]],
        "snapshot_regression_examples": regression_examples,
        "duplicated_effect_examples": effects["examples"],
        "completed_runs_missing_effects": effects["completed_runs_missing_effects"],
        "outcome_only_in_table": sum(1 for v in verdicts if v.in_table and not v.on_topic),
        "outcome_only_on_topic": sum(1 for v in verdicts if v.on_topic and not v.in_table),
        "evidence": {"outcome_records": len(evidence.outcomes), "snapshot_records": len(evidence.snapshots),
                     "dead_letter_records": len(evidence.letters), "run_rows": len(evidence.rows),
                     "effect_rows": sum(r["n"] for r in evidence.effects), "history_rows": evidence.history_rows},
    }
    return report


def _label(v: RunVerdict) -> str:
    return "completed" if v.status == "completed" else f"failed:{v.error_code}"


def _brief(v: RunVerdict) -> dict[str, Any]:
    late = None if v.at is None else round(v.at - v.run.deadline, 2)
    return {"run_id": v.run.run_id, "kind": v.run.kind.name, "outcome": None if v.status is None else _label(v),
            "error": (v.error or "")[:REASON_CHARS] or None, "on_topic": v.on_topic, "in_table": v.in_table,
            "after_deadline_s": late}


def _by_kind(verdicts: list[RunVerdict]) -> dict[str, dict[str, Any]]:
    kinds: dict[str, dict[str, Any]] = {}
    for v in verdicts:
        k = kinds.setdefault(v.run.kind.name, {"expect": v.run.kind.expect, "runs": 0, "as_expected": 0,
                                               "outcomes": Counter()})
        k["runs"] += 1
        label = "lost" if v.status is None else _label(v)
        k["outcomes"][label] += 1
        k["as_expected"] += label == v.run.kind.expect
    return {name: {**k, "outcomes": dict(k["outcomes"])} for name, k in kinds.items()}


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=str)


def merge_reports(reports: list[tuple[str, Report]]) -> Report:
    """One verdict over several cells (``--secure``: two tenants): every count summed (a violation in any
    cell fails the suite), each cell's counts kept under ``cells``, the examples (lost and stuck runs, dead
    letters…) of every cell; the other details (runs by kind, recovery) are the first cell's, where the
    faults aim."""
    if len(reports) == 1:
        return reports[0][1]
    merged = Report(counts={}, details=dict(reports[0][1].details))
    for key, value in reports[0][1].counts.items():
        if isinstance(value, dict):
            total: Counter = Counter()
            for _, report in reports:
                total.update(report.counts[key])
            merged.counts[key] = dict(total)
        else:
            merged.counts[key] = sum(report.counts[key] for _, report in reports)
    merged.details["cells"] = {label: report.counts for label, report in reports}
    for key, value in reports[0][1].details.items():  # the examples (lost runs, dead letters…) of every cell
        if isinstance(value, list) and key != "completed_during_fault":
            merged.details[key] = [item for _, report in reports for item in report.details.get(key, [])]
    return merged
