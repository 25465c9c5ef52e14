"""Compare two runs step by step: pure functions over step dicts, no Kafka, no database.

A run's *decisions* are what a regression check cares about: per step, its kind plus the tool and
arguments, or the retrieval query, or (for a model step) the action the model chose; and the run's
outcome (answer or error code). Results (tool output, passages, model wording) and timings are
reported too, but only a changed decision makes ``RunDiff.decisions_changed`` true, so CI can fail a
candidate model or prompt on behaviour and not on phrasing or speed.

Step dicts carry ``index``, ``kind``, ``status``, ``request``, ``result``, ``error`` and optionally
``total_ms`` / ``compute_ms`` (``Step.as_dict()`` in streams/replay/timeline.py gives all of them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeAlias

from agentstream.streams.core.actions import parse_action
from agentstream.streams.core.errors import ActionError

Decision = tuple[str, ...]
#: How a step compares: ``changed`` (the decision), ``result`` (same decision, different result), or there
#: in one run only.
StepChange: TypeAlias = Literal["same", "changed", "result", "only_a", "only_b"]


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def decision(step: Mapping[str, Any]) -> Decision:
    """What was decided at this step; equal tuples mean the same decision."""
    kind = step.get("kind") or ""
    request = step.get("request") or {}
    result = step.get("result") or {}
    if kind == "model":
        if step.get("error"):
            return ("model", "error", str(step["error"]))
        try:
            action = parse_action(result.get("text") or "")
        except ActionError:
            return ("model", "unparseable")
        if action.kind == "tool":
            return ("model", "tool", action.tool or "", _canon(action.arguments))
        if action.kind == "tools":  # several calls at once: each is a tool step of its own after this one
            return ("model", "tools", *(f"{c.tool} {_canon(c.arguments)}" for c in action.calls))
        if action.kind == "retrieve":
            return ("model", "retrieve", action.query or "")
        return ("model", "final_answer", action.answer or "")
    if kind == "tool" and request.get("child_run_id"):  # a sub-agent's run: which agent, asked what
        return ("agent", str(request.get("agent", "")), str(request.get("task", "")))
    if kind == "tool":
        return ("tool", str(request.get("tool", "")), _canon(request.get("arguments", {})))
    if kind in ("retrieval", "prefetch"):
        return (kind, str(request.get("query", "")))
    return (kind,)


def describe(d: Decision) -> str:
    """A decision for people: ``tool calculator {"expression":"1+1"}``, ``answer "391"``."""
    if not d:
        return "-"
    if d[0] == "model":
        if d[1] == "tool":
            return f"→ tool {d[2]} {d[3]}"
        if d[1] == "tools":
            return "→ tools " + " ∥ ".join(d[2:])
        if d[1] == "retrieve":
            return f"→ retrieve {d[2]!r}"
        if d[1] == "final_answer":
            return f"→ answer {d[2]!r}"
        return "→ " + " ".join(d[1:])
    if d[0] == "tool":
        return f"tool {d[1]} {d[2]}"
    if d[0] in ("retrieval", "prefetch"):
        return f"{d[0]} {d[1]!r}"
    return " ".join(d)


def outcome(run: Mapping[str, Any]) -> Decision:
    """The run's final decision: completed with its answer, or failed with its error code."""
    status = run.get("status") or ""
    if status == "completed":
        return ("completed", str(run.get("answer") or ""))
    if status == "failed":
        return ("failed", str(run.get("error_code") or ""))
    return (status,)


def _result_key(step: Mapping[str, Any]) -> str:
    """The step's result without timings or bookkeeping, for an equality check."""
    result = step.get("result") or {}
    kind = step.get("kind")
    if kind == "model":
        core: Any = result.get("text")
    elif kind == "tool":
        core = [result.get("ok"), result.get("result")]
    else:
        core = [[p.get("id"), p.get("text")] for p in result.get("passages") or []]
    return _canon([core, step.get("error")])


@dataclass(frozen=True)
class StepDiff:
    index: int
    kind_a: str | None
    kind_b: str | None
    decision_a: str | None
    decision_b: str | None
    decision_changed: bool
    result_changed: bool
    total_ms_a: float | None = None
    total_ms_b: float | None = None
    compute_ms_a: float | None = None
    compute_ms_b: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> StepChange:
        if self.kind_b is None:
            return "only_a"
        if self.kind_a is None:
            return "only_b"
        if self.decision_changed:
            return "changed"
        return "result" if self.result_changed else "same"


@dataclass(frozen=True)
class RunDiff:
    run_a: str
    run_b: str
    steps: list[StepDiff]
    outcome_a: str
    outcome_b: str
    outcome_changed: bool

    @property
    def decisions_changed(self) -> bool:
        return self.outcome_changed or any(s.status in ("changed", "only_a", "only_b") for s in self.steps)

    @property
    def changed_steps(self) -> list[int]:
        return [s.index for s in self.steps if s.status in ("changed", "only_a", "only_b")]

    def to_dict(self) -> dict[str, Any]:
        return {"run_a": self.run_a, "run_b": self.run_b, "decisions_changed": self.decisions_changed,
                "changed_steps": self.changed_steps, "outcome_a": self.outcome_a, "outcome_b": self.outcome_b,
                "outcome_changed": self.outcome_changed,
                "steps": [{**asdict(s), "status": s.status} for s in self.steps]}


def _by_index(steps: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    return {int(s["index"]): s for s in steps}


def diff_runs(a: Mapping[str, Any], b: Mapping[str, Any]) -> RunDiff:
    """Align the steps of runs ``a`` and ``b`` by index (the prefetch is index -1) and compare them.

    ``a`` / ``b``: ``{"run_id", "status", "answer", "error_code", "steps": [step dicts]}``.
    """
    sa, sb = _by_index(a.get("steps", ())), _by_index(b.get("steps", ()))
    out: list[StepDiff] = []
    for index in sorted(set(sa) | set(sb)):
        x, y = sa.get(index), sb.get(index)
        da = decision(x) if x is not None else None
        db = decision(y) if y is not None else None
        notes: list[str] = []
        changed = da != db
        result_changed = False
        if x is not None and y is not None:
            if x.get("kind") != y.get("kind"):
                notes.append(f"kind {x.get('kind')} → {y.get('kind')}")
            elif changed and x.get("kind") == "tool" and da and db and da[1] == db[1]:
                notes.append(f"arguments {da[2]} → {db[2]}")
            pa, pb = _parallel(x), _parallel(y)
            if pa != pb:
                notes.append(f"{pa or 'alone'} → {pb or 'alone'}")
            result_changed = _result_key(x) != _result_key(y)
            if result_changed and not changed:
                notes.append("same decision, different result")
            if (x.get("kind") == "model" and not changed
                    and (x.get("result") or {}).get("text") != (y.get("result") or {}).get("text")):
                notes.append("same action, different wording")
            if (x.get("error") or None) != (y.get("error") or None):
                notes.append(f"error {x.get('error')!r} → {y.get('error')!r}")
        out.append(StepDiff(
            index=index, kind_a=x.get("kind") if x else None, kind_b=y.get("kind") if y else None,
            decision_a=describe(da) if da else None, decision_b=describe(db) if db else None,
            decision_changed=changed, result_changed=result_changed,
            total_ms_a=_ms(x, "total_ms"), total_ms_b=_ms(y, "total_ms"),
            compute_ms_a=_ms(x, "compute_ms"), compute_ms_b=_ms(y, "compute_ms"), notes=notes))
    oa, ob = outcome(a), outcome(b)
    return RunDiff(run_a=str(a.get("run_id", "")), run_b=str(b.get("run_id", "")), steps=out,
                   outcome_a=" ".join(oa), outcome_b=" ".join(ob), outcome_changed=oa != ob)


@dataclass
class TreeDiff:
    """Two runs' diff and, under each step where both called a sub-agent, their children's (trees of
    agents: services/planner/subagents.py)."""

    run: RunDiff
    children: dict[int, TreeDiff] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Decisions differ somewhere in the two trees."""
        return bool(self.run.decisions_changed) or any(c.changed for c in self.children.values())

    def to_dict(self) -> dict[str, Any]:
        return {**self.run.to_dict(), "children": {i: c.to_dict() for i, c in self.children.items()}}


def children_of(run: Mapping[str, Any]) -> dict[int, str]:
    """A run summary's sub-agent calls: step index → the child run it started."""
    return {s["index"]: s["request"]["child_run_id"] for s in run["steps"]
            if isinstance(s.get("request"), Mapping) and s["request"].get("child_run_id")}


def diff_tree(a: Mapping[str, Any], b: Mapping[str, Any],
              load: Callable[[str, str], Mapping[str, Mapping[str, Any]]]) -> TreeDiff:
    """``diff_runs`` of two runs, and recursively of the two children each step where both called a
    sub-agent started (``load(child_a, child_b)``: their summaries by run id; one missing: not compared)."""
    kids_a, kids_b = children_of(a), children_of(b)
    children: dict[int, TreeDiff] = {}
    for index in sorted(kids_a.keys() & kids_b.keys()):
        found = load(kids_a[index], kids_b[index])
        if kids_a[index] in found and kids_b[index] in found:
            children[index] = diff_tree(found[kids_a[index]], found[kids_b[index]], load)
    return TreeDiff(diff_runs(a, b), children)


def _parallel(step: Mapping[str, Any]) -> str | None:
    """``call 2 of 3`` for a call made side by side with others of one model reply (its request's
    ``parallel``, services/planner/publishing.py), else None."""
    parallel = (step.get("request") or {}).get("parallel")
    if not isinstance(parallel, dict):
        return None
    return f"call {int(parallel.get('call', 0)) + 1} of {parallel.get('calls')}"


def _ms(step: Mapping[str, Any] | None, key: str) -> float | None:
    value = step.get(key) if step is not None else None
    return round(float(value), 2) if value is not None else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass(frozen=True)
class WindowReport:
    """Aggregate differences of many reruns against their originals (``agentstream replay window``)."""

    runs: int
    decisions_changed: list[tuple[str, str]]  # (original, rerun)
    completed: tuple[int, int]  # (originals, reruns)
    failed: tuple[int, int]
    tokens: tuple[int, int]
    ttft_p50_ms: tuple[float | None, float | None]

    def to_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "decisions_changed": len(self.decisions_changed),
                "changed_runs": [{"original": a, "rerun": b} for a, b in self.decisions_changed],
                "completed": {"original": self.completed[0], "rerun": self.completed[1]},
                "failed": {"original": self.failed[0], "rerun": self.failed[1]},
                "tokens": {"original": self.tokens[0], "rerun": self.tokens[1],
                           "delta": self.tokens[1] - self.tokens[0]},
                "ttft_p50_ms": {"original": self.ttft_p50_ms[0], "rerun": self.ttft_p50_ms[1],
                                "delta": None if None in self.ttft_p50_ms
                                else round((self.ttft_p50_ms[1] or 0) - (self.ttft_p50_ms[0] or 0), 2)}}


def window_report(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]]) -> WindowReport:
    """``pairs``: (original run, rerun) dicts as for ``diff_runs``."""

    def tokens(run: Mapping[str, Any]) -> int:
        return sum(int((s.get("result") or {}).get(k) or 0) for s in run.get("steps", ())
                   if s.get("kind") == "model" for k in ("prompt_tokens", "completion_tokens"))

    def ttfts(runs: Iterable[Mapping[str, Any]]) -> list[float]:
        return [float((s.get("result") or {}).get("ttft_ms") or 0) for r in runs for s in r.get("steps", ())
                if s.get("kind") == "model" and s.get("result") and not s.get("error")]

    changed = [(str(a["run_id"]), str(b["run_id"])) for a, b in pairs if diff_runs(a, b).decisions_changed]

    def count(status: str, side: int) -> int:
        return sum(1 for p in pairs if p[side].get("status") == status)

    p50a, p50b = percentile(ttfts(a for a, _ in pairs), 0.5), percentile(ttfts(b for _, b in pairs), 0.5)
    return WindowReport(runs=len(pairs), decisions_changed=changed,
                        completed=(count("completed", 0), count("completed", 1)),
                        failed=(count("failed", 0), count("failed", 1)),
                        tokens=(sum(tokens(a) for a, _ in pairs), sum(tokens(b) for _, b in pairs)),
                        ttft_p50_ms=(None if p50a is None else round(p50a, 2), None if p50b is None else round(p50b, 2)))
