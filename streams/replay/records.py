"""A run's timeline as data: its steps, its recorded events, the chart's spans and the time budget.

How the numbers are read (which timestamps make a step's queue, compute and transport time) is told in
``agentstream.streams.replay.timeline``, which loads them from PostgreSQL.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias

from agentstream.streams.core.kinds import StepKind, StepStatus
from agentstream.streams.store.history import RunColumns

SERVICE_OF = {"model": "inference", "tool": "tools", "retrieval": "retrieval", "prefetch": "retrieval"}
LANES = ("planner", "inference", "tools", "retrieval")
REQUESTS = frozenset({"InferenceRequested", "ToolCallRequested", "RetrievalRequested"})
RESULTS = frozenset({"InferenceCompleted", "ToolCallCompleted", "RetrievalCompleted"})
#: Planner inputs that lead to a transition (results of the prefetch lead to none visible here).
PLANNER_INPUTS = RESULTS | {"TaskSubmitted", "ApprovalDecided", "RunCancelRequested"}

#: What the cross-check found for an event: ``unrecorded`` when its row has no offset.
KafkaCheck: TypeAlias = Literal["verified", "missing", "mismatched", "unrecorded", "unchecked"]
#: A bar of the chart: time in a queue, at work, on the way back to the planner, or the planner's own.
SpanKind: TypeAlias = Literal["queue", "compute", "transport", "planner"]


class RunRecord(RunColumns):
    """The run's row of ``runs`` (what the timeline shows of it)."""

    replay_of: str | None


def ms(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds() * 1000


@dataclass
class EventInfo:
    event_id: str
    step_id: str | None
    event_type: str
    topic: str
    partition: int | None
    offset: int | None
    produced_at: datetime
    appended_at: datetime | None
    consumed_at: datetime | None
    consumed_by: str | None
    payload: dict[str, Any] | None = None
    kafka: KafkaCheck = "unchecked"
    kafka_note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in self.__dict__.items()
                if k != "payload"}


@dataclass
class Step:
    index: int
    kind: StepKind
    step_id: str
    status: StepStatus
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    requested_at: datetime
    completed_at: datetime | None
    sent_at: datetime | None = None  # request appended to Kafka
    picked_at: datetime | None = None  # request consumed by the service
    done_at: datetime | None = None  # result created by the service
    result_sent_at: datetime | None = None  # result appended to Kafka
    returned_at: datetime | None = None  # result consumed by the planner

    @property
    def service(self) -> str:
        return SERVICE_OF.get(self.kind, self.kind)

    @property
    def from_prefetch(self) -> bool:
        return bool(self.request.get("from_prefetch"))

    @property
    def parallel(self) -> tuple[int, int] | None:
        """(k, n): this tool step is call k (from 0) of n that one model reply made side by side (the
        request's ``parallel``, services/planner/publishing.py); None for a step made alone."""
        p = self.request.get("parallel")
        return (int(p.get("call", 0)), int(p.get("calls", 1))) if isinstance(p, dict) else None

    @property
    def label(self) -> str:
        """``#3 tool``, or ``#3 tool ∥ 2/4`` for the second of four calls made side by side."""
        p = self.parallel
        return f"#{self.index} {self.kind}" + (f" ∥ {p[0] + 1}/{p[1]}" if p else "")

    @property
    def queue_ms(self) -> float | None:
        return ms(self.sent_at, self.picked_at)

    @property
    def compute_ms(self) -> float | None:
        return ms(self.picked_at, self.done_at)

    @property
    def transport_ms(self) -> float | None:
        return ms(self.result_sent_at, self.returned_at)

    @property
    def total_ms(self) -> float | None:
        return ms(self.requested_at, self.completed_at)

    def usage(self, key: str) -> float:
        return float((self.result or {}).get(key) or 0) if self.kind == "model" else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The step for JSON and for streams/replay/diff.py."""
        out = {"index": self.index, "kind": self.kind, "service": self.service, "step_id": self.step_id,
               "status": self.status, "request": self.request, "result": self.result, "error": self.error,
               "from_prefetch": self.from_prefetch}
        for name in ("queue_ms", "compute_ms", "transport_ms", "total_ms"):
            value = getattr(self, name)
            out[name] = None if value is None else round(value, 3)
        for name in ("requested_at", "completed_at", "sent_at", "picked_at", "done_at", "result_sent_at",
                     "returned_at"):
            value = getattr(self, name)
            out[name] = value.isoformat() if value else None
        return out


@dataclass(frozen=True)
class Span:
    """One bar of the Gantt chart, in ms since the run was submitted."""

    lane: str
    kind: SpanKind
    start_ms: float
    end_ms: float
    step: int | None
    label: str
    #: (k, n): the bar of call k of n made side by side (drawn in a row of its own within the lane).
    row: tuple[int, int] | None = None


@dataclass
class Budget:
    wall_ms: float
    transport_ms: float  # Kafka hops and queues: task hop + Σ (queue + transport back)
    compute_ms: float
    planner_ms: float

    @property
    def other_ms(self) -> float:
        return max(0.0, self.wall_ms - self.transport_ms - self.compute_ms - self.planner_ms)

    def share(self, value: float) -> float:
        return value / self.wall_ms if self.wall_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        parts = {"transport_and_queues": self.transport_ms, "compute": self.compute_ms,
                 "planner": self.planner_ms, "other": self.other_ms}
        return {"wall_ms": round(self.wall_ms, 3),
                **{f"{k}_ms": round(v, 3) for k, v in parts.items()},
                **{f"{k}_share": round(self.share(v), 4) for k, v in parts.items()}}


@dataclass
class Timeline:
    run: RunRecord
    steps: list[Step]
    events: list[EventInfo]
    planner: list[Span] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # how long loading and checking took

    @property
    def start(self) -> datetime:
        return self.run["submitted_at"]

    @property
    def end(self) -> datetime:
        return self.run["finished_at"] or self.run["updated_at"]

    @property
    def task(self) -> dict[str, Any]:
        """The TaskSubmitted's fields (task, tools, max_steps, deadline, model, system_prompt, …)."""
        for e in self.events:
            if e.event_type == "TaskSubmitted" and e.payload is not None:
                return e.payload
        return {}

    def kafka_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for e in self.events:
            counts[e.kafka] += 1
        return dict(counts)

    def spans(self) -> list[Span]:
        """Every bar of the chart: planner work, and per service step its queue, compute and transport."""
        t0 = self.start
        out = list(self.planner)
        task = next((e for e in self.events if e.event_type == "TaskSubmitted"), None)
        if task is not None and task.consumed_at is not None:
            out.append(Span("planner", "queue", ms(t0, task.produced_at) or 0.0, ms(t0, task.consumed_at) or 0.0,
                            None, "task → planner"))
        for s in self.steps:
            lane, label = s.service, s.label
            bars: tuple[tuple[SpanKind, datetime | None, datetime | None], ...] = (
                ("queue", s.sent_at, s.picked_at), ("compute", s.picked_at, s.done_at),
                ("transport", s.result_sent_at, s.returned_at))
            for kind, a, b in bars:
                if a is not None and b is not None:
                    out.append(Span(lane, kind, ms(t0, a) or 0.0, ms(t0, b) or 0.0, s.index, label, s.parallel))
        return out

    def budget(self) -> Budget:
        """The speed-of-light budget of the main chain (the prefetch runs beside it). Of calls made side by
        side, only the one that took longest is on the chain."""
        main = _critical([s for s in self.steps if s.index >= 0])
        task = next((e for e in self.events if e.event_type == "TaskSubmitted"), None)
        hop = max(0.0, ms(task.produced_at, task.consumed_at) or 0.0) if task else 0.0
        return Budget(
            wall_ms=max(0.0, ms(self.start, self.end) or 0.0),
            transport_ms=hop + sum(max(0.0, s.queue_ms or 0.0) + max(0.0, s.transport_ms or 0.0) for s in main),
            compute_ms=sum(max(0.0, s.compute_ms or 0.0) for s in main),
            planner_ms=sum(max(0.0, sp.end_ms - sp.start_ms) for sp in self.planner))

    def totals(self) -> dict[str, Any]:
        models = [s for s in self.steps if s.kind == "model"]
        ttfts = sorted(s.usage("ttft_ms") for s in models if s.result and not s.error)
        return {"prompt_tokens": int(sum(s.usage("prompt_tokens") for s in models)),
                "completion_tokens": int(sum(s.usage("completion_tokens") for s in models)),
                "cached_prompt_tokens": int(sum(s.usage("cached_prompt_tokens") for s in models)),
                "ttft_p50_ms": round(ttfts[len(ttfts) // 2], 3) if ttfts else None}

    def summary(self) -> dict[str, Any]:
        """The run, for diff and window: its outcome and its steps as dicts."""
        return {"run_id": self.run["run_id"], "status": self.run["status"], "answer": self.run["answer"],
                "error_code": self.run["error_code"], "steps": [s.as_dict() for s in self.steps]}

    def as_dict(self) -> dict[str, Any]:
        run = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in self.run.items()}
        return {"run": run, "task": self.task, "totals": self.totals(), "budget": self.budget().as_dict(),
                "kafka": self.kafka_counts(), "steps": [s.as_dict() for s in self.steps],
                "events": [e.as_dict() for e in self.events],
                "spans": [sp.__dict__ for sp in self.spans()], "timings_ms": self.timings}


def _critical(steps: list[Step]) -> list[Step]:
    """``steps`` with each group of parallel calls reduced to its longest call (queue + compute + back)."""
    groups: dict[int, Step] = {}
    out: list[Step] = []
    for s in steps:
        p = s.parallel
        if p is None:
            out.append(s)
            continue
        first = s.index - p[0]
        best = groups.get(first)
        if best is None or _chain_ms(s) > _chain_ms(best):
            groups[first] = s
    return out + list(groups.values())


def _chain_ms(s: Step) -> float:
    return sum(max(0.0, v or 0.0) for v in (s.queue_ms, s.compute_ms, s.transport_ms))


__all__ = ["LANES", "PLANNER_INPUTS", "REQUESTS", "RESULTS", "SERVICE_OF", "Budget", "EventInfo", "KafkaCheck",
           "RunRecord", "Span", "SpanKind", "Step", "Timeline", "ms"]
