"""The chaos suite (bench/chaos/chaos.py): with several processes of every service and faults happening, every
run still finishes exactly once.

- ``test_quick_chaos_suite``: the suite's ``--quick`` version (about two minutes, on a Kafka + PostgreSQL
  stack of its own: it never touches the stack the other tests use). Every invariant must hold: nothing
  lost or stuck, no side effect or event applied twice, no snapshot going back, no dead letter but the
  injected poison's, a reason for every failure. On failure the message holds the suite's summary and
  the end of every process's log.
- The other tests feed the suite's verdict (bench/chaos/chaos_check.py) fabricated evidence with one violation
  of each kind: a green suite means something only if each check can turn red.
"""

from __future__ import annotations

import importlib
import json
import signal
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from agentstream.streams.core.events import DeadLetter, RunCompleted, RunFailed, RunStateSnapshot

ROOT = Path(__file__).resolve().parents[2]
#: The quick suite takes about two minutes; more than this is a hang, not a slow machine.
SUITE_TIMEOUT_S = 300
#: On a timeout the suite gets this long to tear its stack down after SIGTERM.
TEARDOWN_S = 90
#: Characters of the suite's output quoted in a failure message.
OUTPUT_CHARS = 15000


@pytest.fixture(scope="module")
def chaos() -> dict[str, ModuleType]:
    """The suite's modules, imported as the suite imports them (``bench.chaos.<name>``)."""
    return {name: importlib.import_module(f"bench.chaos.{name}")
            for name in ("chaos_check", "chaos_load", "chaos_faults", "chaos_poison")}


# -- the quick suite ------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(SUITE_TIMEOUT_S + TEARDOWN_S + 30)
def test_quick_chaos_suite(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "bench.chaos.chaos", "--quick", "--json"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=SUITE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the suite stops its processes and its stack on SIGTERM
        try:
            out, _ = proc.communicate(timeout=TEARDOWN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"the quick chaos suite ran past {SUITE_TIMEOUT_S} s:\n{out[-OUTPUT_CHARS:]}")
    (tmp_path / "chaos-quick.out").write_text(out)  # the whole output, JSON last, for after the fact
    lines = out.strip().splitlines()
    result = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {"suite_error": "no JSON"}
    context = f"(whole output: {tmp_path / 'chaos-quick.out'})\n{out[-OUTPUT_CHARS:]}"
    assert "suite_error" not in result, f"the suite could not run: {result.get('suite_error')}\n{context}"
    assert result["runs"] > 0, context
    violations = {key: result[key] for key in ("lost", "stuck", "duplicated_effects", "duplicated_events",
                                               "snapshot_regressions", "dead_letters", "failed_without_reason",
                                               "session_violations", "tree_violations")
                  if result[key]}
    details = {key: result[key] for key in ("lost_runs", "stuck_runs", "duplicated_events_detail",
                                            "duplicated_effect_examples", "snapshot_regression_examples",
                                            "dead_letter_reasons")}
    assert not violations, f"{violations}\n{json.dumps(details, indent=1)[:OUTPUT_CHARS]}\n{context}"
    assert not result["fault_errors"], f"faults the suite could not carry out: {result['fault_errors']}\n{context}"
    assert result["ok"], context


# -- the verdict can turn red ---------------------------------------------------------------------------
NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
T0 = NOW.timestamp()
DEADLINE_S = 60.0
GRACE_S = 10.0


def _run(chaos: dict[str, ModuleType], run_id: str, kind: str = "effects"):
    load = chaos["chaos_load"]
    kinds = {k.name: k for k in load.run_kinds(slow_ms=1000, cancel_after_s=0.2)}
    return load.SubmittedRun(run_id, kinds[kind], created=T0, deadline=T0 + DEADLINE_S, acked=T0)


def _rec(chaos: dict[str, ModuleType], event, offset: int, at: float = T0 + 1, partition: int = 0):
    return chaos["chaos_check"].TopicRecord(partition, offset, at, event.run_id.encode(), event)


def _completed(run_id: str):
    return RunCompleted.build(run_id=run_id, step=f"{run_id}:outcome", service="planner", answer="done",
                              steps=3, duration_ms=10.0)


def _failed(run_id: str, code: str = "cancelled", error: str = "cancelled on request"):
    return RunFailed.build(run_id=run_id, step=f"{run_id}:outcome", service="planner", error_code=code,
                           error=error, steps=1, duration_ms=10.0)


def _snapshot(run_id: str, version: int, status: str = "running", step_index: int = 1):
    return RunStateSnapshot.build(run_id=run_id, step=f"{run_id}:snapshot", service="planner", status=status,
                                  task="t", max_steps=8, step_index=step_index, version=version,
                                  submitted_at=NOW, updated_at=NOW)


def _letter(run_id: str, topic: str, offset: int):
    return DeadLetter.build(run_id=run_id, step=f"dlq:{topic}:0:{offset}", service="planner", consumer="planner",
                            source_topic=topic, source_partition=0, source_offset=offset,
                            error_kind="handler_error", reason="boom")


def _row(status: str, code: str | None = None, error: str | None = None) -> dict:
    return {"status": status, "error_code": code, "error": error, "finished_at": NOW, "version": 3}


def _evidence(chaos: dict[str, ModuleType], **parts):
    fields = {"outcomes": [], "snapshots": [], "letters": [], "rows": {}, "effects": [], "event_dupes": []}
    fields.update(parts)
    return chaos["chaos_check"].Evidence(**fields, history_rows=10)


def test_a_clean_run_passes(chaos: dict[str, ModuleType]) -> None:
    check = chaos["chaos_check"]
    run = _run(chaos, "run-a")
    evidence = _evidence(chaos, outcomes=[_rec(chaos, _completed("run-a"), 0)],
                         snapshots=[_rec(chaos, _snapshot("run-a", v), v) for v in (1, 2, 2, 3)],
                         rows={"run-a": _row("completed")},
                         effects=[{"run_id": "run-a", "step_id": f"run-a:{i}:tool", "n": 1} for i in (1, 3)])
    report = check.build_report([run], evidence, [], [], GRACE_S, {"run-a": T0 + 2})
    assert report.counts == {"runs": 1, "completed": 1, "failed_by": {}, "lost": 0, "stuck": 0,
                             "duplicated_effects": 0, "duplicated_events": 0, "snapshot_regressions": 0,
                             "dead_letters": 0, "failed_without_reason": 0, "session_violations": 0,
                             "tree_violations": 0}
    assert report.details["completed_runs_missing_effects"] == 0


def test_a_sessions_transcript_is_checked_against_its_completed_turns(chaos: dict[str, ModuleType]) -> None:
    """Every completed turn once, in its order on the partition (``session_seq``), the oldest maybe dropped."""
    check = chaos["chaos_check"]
    turns = [replace(_run(chaos, f"t{i}", "session"), session="s") for i in (1, 2, 3)]
    rows = {t.run_id: _row("completed") for t in turns}
    outcomes = [_rec(chaos, _completed(t.run_id), n) for n, t in enumerate(turns)]
    seqs = {"t1": 4, "t2": 9, "t3": 12}

    def violations(transcript: list[str], dropped: int = 0) -> int:
        evidence = _evidence(chaos, outcomes=outcomes, rows=rows, sessions={"s": (transcript, dropped)}, seqs=seqs)
        return check.build_report(turns, evidence, [], [], GRACE_S, {}).counts["session_violations"]

    assert violations(["baseline", "t1", "t2", "t3"]) == 0  # (a turn the verdict does not judge may come first)
    assert violations(["t2", "t3"], dropped=1) == 0  # the oldest dropped for the budget
    assert violations(["t2", "t1", "t3"]) == 1  # reordered
    assert violations(["t1", "t3"]) == 1  # lost
    assert violations(["t1", "t2", "t2", "t3"]) == 1  # doubled


def test_a_trees_children_are_checked_one_per_step_each_completed(chaos: dict[str, ModuleType]) -> None:
    check = chaos["chaos_check"]
    parent = _run(chaos, "p", "tree")
    evidence = dict(outcomes=[_rec(chaos, _completed("p"), 0)], rows={"p": _row("completed")})

    def kid(run_id: str, step: str, status: str = "completed") -> dict:
        return {"run_id": run_id, "status": status, "parent": "p", "step": step}

    def report(children: list[dict], effects: tuple[str, ...] = ("c1", "c2")):
        found = _evidence(chaos, **evidence, children=children,
                          effects=[{"run_id": r, "step_id": f"{r}:1:tool", "n": 1} for r in effects])
        return check.build_report([parent], found, [], [], GRACE_S, {})

    def violations(children: list[dict], effects: tuple[str, ...] = ("c1", "c2")) -> int:
        return report(children, effects).counts["tree_violations"]

    assert violations([kid("c1", "p:1:tool"), kid("c2", "p:2:tool")]) == 0
    assert violations([kid("c1", "p:1:tool")], effects=("c1",)) == 1  # a child lost
    assert violations([kid("c1", "p:1:tool"), kid("c2", "p:2:tool", "failed")]) == 1  # unfinished under an answer
    # A completed child whose call was cut off (answered "interrupted", at most once) is counted, not a violation.
    assert violations([kid("c1", "p:1:tool"), kid("c2", "p:2:tool")], effects=("c1",)) == 0
    assert report([kid("c1", "p:1:tool"), kid("c2", "p:2:tool")], effects=("c1",)).details["trees"][
        "children_missing_effects"] == 1
    assert violations([kid("c1", "p:1:tool"), kid("c2", "p:1:tool")]) == 1  # one step, two children


def test_each_violation_is_counted(chaos: dict[str, ModuleType]) -> None:
    check = chaos["chaos_check"]
    runs = [_run(chaos, r) for r in ("lost", "table-only", "late", "twice", "regress", "no-reason")]
    outcomes = [_rec(chaos, _completed("late"), 0), _rec(chaos, _completed("twice"), 1),
                _rec(chaos, _failed("twice"), 2), _rec(chaos, _completed("twice"), 3),  # a copy: not counted
                _rec(chaos, _failed("no-reason", "tool_failed", ""), 4)]
    snapshots = [_rec(chaos, _snapshot("regress", v), n) for n, v in enumerate((1, 3, 2))]
    snapshots.append(_rec(chaos, _snapshot("regress", 3, status="failed"), 3))  # a fork of version 3
    injected = [chaos["chaos_poison"].Injected("random_bytes", "agent.tasks", 0, 7, "poison-x", 10)]
    letters = [_rec(chaos, _letter("", "agent.tasks", 7), 0),  # the injected record's own letter
               _rec(chaos, _letter("poison-x", "agent.inference.requests", 3), 1),  # derived from poison
               _rec(chaos, _letter("regress", "agent.tool.results", 9), 2)]  # real traffic
    evidence = _evidence(
        chaos, outcomes=outcomes, snapshots=snapshots, letters=letters,
        rows={"table-only": _row("completed"), "late": _row("completed"), "twice": _row("failed", "cancelled", "x"),
              "regress": _row("running"), "no-reason": _row("failed", "tool_failed", "")},
        effects=[{"run_id": "twice", "step_id": "twice:1:tool", "n": 3}],
        event_dupes=[{"run_id": "regress", "step_id": "regress:2:model", "event_type": "InferenceCompleted", "n": 2}])
    late_seen = T0 + DEADLINE_S + GRACE_S + 5
    report = check.build_report(runs, evidence, injected, [], GRACE_S, {"late": late_seen})
    c, d = report.counts, report.details
    assert c["lost"] == 2  # "lost" has no outcome; "regress" neither (its row is not terminal)
    assert c["stuck"] == 2  # "table-only": no outcome on the topic; "late": read after deadline + grace
    assert c["duplicated_effects"] == 2  # three rows for one step
    dup = d["duplicated_events_detail"]
    # "twice": completed then failed on the topic, and its row says failed; a step recorded twice; a fork.
    assert (dup["outcomes"], dup["outcome_disagreements"], dup["steps"], dup["snapshot_forks"]) == (1, 1, 1, 1)
    assert c["duplicated_events"] == 4
    assert c["snapshot_regressions"] == 1
    assert c["dead_letters"] == 1 and d["dead_letter_reasons"][0]["run_id"] == "regress"
    assert [x["run_id"] for x in d["poison_derived_dead_letters"]] == ["poison-x"]
    assert d["injected"][0]["dead_letters"] == [{"consumer": "planner", "error_kind": "handler_error", "reason": "boom"}]
    assert c["failed_without_reason"] == 1
    assert c["failed_by"] == {"tool_failed": 1}  # "twice" is judged by its first outcome: completed
    assert c["completed"] == 3


def test_a_row_that_disagrees_with_the_topic_is_a_second_outcome(chaos: dict[str, ModuleType]) -> None:
    check = chaos["chaos_check"]
    evidence = _evidence(chaos, outcomes=[_rec(chaos, _completed("run-b"), 0)],
                         rows={"run-b": _row("failed", "deadline_exceeded", "late")})
    report = check.build_report([_run(chaos, "run-b")], evidence, [], [], GRACE_S, {})
    assert report.details["duplicated_events_detail"]["outcome_disagreements"] == 1
    assert report.counts["duplicated_events"] == 1


def test_recovery_is_measured_from_the_end_of_a_fault(chaos: dict[str, ModuleType]) -> None:
    check, faults = chaos["chaos_check"], chaos["chaos_faults"]
    runs = [_run(chaos, r) for r in ("r1", "r2", "r3")]
    outcomes = [_rec(chaos, _completed(r), n) for n, r in enumerate(("r1", "r2", "r3"))]
    seen = {"r1": T0 + 5, "r2": T0 + 12, "r3": T0 + 20}
    fault = faults.FaultRecord("postgres_outage postgresql", "postgres_outage", "postgresql", 0.0,
                               started=T0 + 4, ended=T0 + 10)
    report = check.build_report(runs, _evidence(chaos, outcomes=outcomes), [], [fault], GRACE_S, seen)
    assert report.details["recovery_s"] == {"01 postgres_outage postgresql": 2.0}
    assert report.details["completed_during_fault"] == [1]


def test_every_kind_of_fault_is_planned_in_both_modes(chaos: dict[str, ModuleType]) -> None:
    faults = chaos["chaos_faults"]
    kinds = {"sigkill", "scale_up", "scale_down", "pause", "postgres_outage", "broker_kill", "model_outage", "poison"}
    for timings in (faults.FULL, faults.QUICK):
        plan = faults.build_plan(timings)
        assert {s.kind for s in plan} == kinds
        killed = [s.target for s in plan if s.kind == "sigkill"]
        for service in faults.SERVICES:  # every service several times, both instances
            assert sum(t.startswith(service) for t in killed) >= 2
            assert {f"{service}-1", f"{service}-2"} <= set(killed)
        pause = next(s for s in plan if s.kind == "pause")
        assert pause.hold_s * 1000 > 6000  # past the suite's session timeout


def test_on_a_cluster_a_node_and_later_the_controller_are_killed(chaos: dict[str, ModuleType]) -> None:
    faults = chaos["chaos_faults"]
    for timings in (faults.FULL, faults.QUICK):
        single = [s.target for s in faults.build_plan(timings) if s.kind == "broker_kill"]
        cluster = [s.target for s in faults.build_plan(timings, brokers=3) if s.kind == "broker_kill"]
        assert single == ["kafka"]
        assert cluster == ["node-2", faults.CONTROLLER]


def test_the_controller_is_the_leader_of_the_newest_quorum_epoch(chaos: dict[str, ModuleType], tmp_path: Path) -> None:
    """Each live node's ``quorum-state`` names the leader it knows; a dead node's stale file is ignored."""
    faults = chaos["chaos_faults"]
    states = {1: (2, 7), 2: (3, 9), 3: (1, 12)}  # node: (leader it recorded, epoch)
    nodes = []
    for n, (leader, epoch) in states.items():
        data = tmp_path / f"node{n}" / "__cluster_metadata-0"
        data.mkdir(parents=True)
        (data / "quorum-state").write_text(json.dumps({"leaderId": leader, "leaderEpoch": epoch, "votedId": -1}))
        nodes.append(SimpleNamespace(data_dir=data.parent))
    alive = {1, 2, 3}
    stack = SimpleNamespace(cluster=SimpleNamespace(nodes=nodes), kafka_pid=lambda n: 100 + n if n in alive else None)
    assert faults.controller_leader(stack) == 1
    alive.discard(3)  # node 3 is down: its newer-looking file is not news
    assert faults.controller_leader(stack) == 3
    alive.clear()
    with pytest.raises(RuntimeError):
        faults.controller_leader(stack)


def test_a_violation_in_any_cell_fails_the_merged_verdict(chaos: dict[str, ModuleType]) -> None:
    """``--secure`` judges each tenant's cell apart and sums: the other tenant's lost run counts."""
    check = chaos["chaos_check"]
    clean = check.build_report([_run(chaos, "a")], _evidence(
        chaos, outcomes=[_rec(chaos, _completed("a"), 0)], rows={"a": _row("completed")}), [], [], GRACE_S,
        {"a": T0 + 2})
    lost = check.build_report([_run(chaos, "b1"), _run(chaos, "b2")], _evidence(
        chaos, outcomes=[_rec(chaos, _failed("b1", "tool_failed", "boom"), 0)],
        rows={"b1": _row("failed", "tool_failed", "boom")}), [], [], GRACE_S, {"b1": T0 + 2})
    merged = check.merge_reports([("acme", clean), ("beta", lost)])
    assert merged.counts["runs"] == 3 and merged.counts["completed"] == 1 and merged.counts["lost"] == 1
    assert merged.counts["failed_by"] == {"tool_failed": 1}
    assert merged.details["cells"] == {"acme": clean.counts, "beta": lost.counts}
    assert [r["run_id"] for r in merged.details["lost_runs"]] == ["b2"]  # named, whichever cell it was in
    assert check.merge_reports([("default", clean)]) is clean
