"""PostgreSQL history: runs, steps and events, written by the planner one transition at a time.

Transitions from many runs are written together (group commit): while one batch is being written the
next one gathers, so under load one transaction (and one WAL flush) carries many transitions, and at
low load a transition is written at once. A batch is one round trip: a JSON document handed to the
``agentstream_record_transitions`` function. Each caller still waits for its own transition to commit.
A run's row is updated only if its version is the one the transition started from; otherwise that
transition raises ``VersionConflict`` (retriable: the planner reloads and re-decides).
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg
import orjson

from streams.errors import AgentStreamError
from streams.events import Event, InferenceRequested


class VersionConflict(AgentStreamError):
    """Another writer moved the run on; reload its state and try again."""

    retriable = True


@dataclass(frozen=True, kw_only=True)
class EventRow:
    event: Event
    topic: str
    partition: int | None = None
    offset: int | None = None
    appended_at: datetime | None = None
    consumed_at: datetime | None = None
    consumed_by: str | None = None
    traceparent: str | None = None


@dataclass(frozen=True, kw_only=True)
class SourceUpdate:
    """Where and when a request was consumed (from the headers of the result that answers it)."""

    event_id: str
    partition: int
    offset: int
    appended_at: datetime | None
    consumed_at: datetime
    consumed_by: str


@dataclass(frozen=True, kw_only=True)
class StepRow:
    step_id: str
    run_id: str
    step_index: int
    kind: str
    request: dict[str, Any]
    requested_at: datetime


@dataclass(frozen=True, kw_only=True)
class StepResult:
    step_id: str
    status: str  # completed | failed
    result: dict[str, Any]
    error: str | None
    completed_at: datetime


@dataclass(frozen=True, kw_only=True)
class RunRow:
    run_id: str
    status: str
    task: str
    state: dict[str, Any]
    version: int
    #: The version this transition started from; None when it creates the run.
    expected_version: int | None
    step_count: int
    answer: str | None
    error_code: str | None
    error: str | None
    traceparent: str | None
    submitted_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True, kw_only=True)
class Transition:
    run: RunRow
    events: Sequence[EventRow] = ()
    sources: Sequence[SourceUpdate] = ()
    steps_requested: Sequence[StepRow] = ()
    steps_completed: Sequence[StepResult] = ()


@dataclass
class _Pending:
    transition: Transition
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def to_json(value: Any) -> str:
    """JSON for PostgreSQL (orjson: datetimes as ISO 8601, bytes as base64). A batch document is
    built for every group commit, so the encoder's speed shows in the planner's CPU profile."""
    return orjson.dumps(value, default=_json_default).decode()


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


class TransitionStore:
    """Reads go through ``pool``; batches are written on ``writer`` by at most ``flushers`` concurrent
    flushes (give the writer that many connections, kept warm so the function's plans stay cached).
    Two flushes overlap one batch's commit with the next batch's gathering."""

    def __init__(self, pool: asyncpg.Pool, writer: asyncpg.Pool | None = None, *, max_batch: int = 500,
                 flushers: int = 2) -> None:
        self.pool = pool
        self.writer = writer or pool
        self.max_batch = max_batch
        self.flushers = flushers
        self._queue: list[_Pending] = []
        self._active = 0
        self._tasks: set[asyncio.Task] = set()
        self.stats = {"batches": 0, "transitions": 0, "flush_s": 0.0}

    async def load_state(self, run_id: str) -> str | None:
        """The run's state JSON, or None for a run never recorded."""
        return await self.pool.fetchval("SELECT state::text FROM runs WHERE run_id = $1", run_id)

    async def active_states(self, topic_prefix: str = "") -> list[str]:
        """The unfinished runs of the pipeline on ``topic_prefix`` (replays and tests share the database)."""
        rows = await self.pool.fetch(
            "SELECT state::text AS s FROM runs WHERE status NOT IN ('completed', 'failed')"
            " AND coalesce(state->>'topic_prefix', '') = $1", topic_prefix)
        return [r["s"] for r in rows]

    async def write(self, transition: Transition) -> None:
        """Commit one transition (batched with concurrent ones); raises ``VersionConflict``."""
        pending = _Pending(transition)
        self._queue.append(pending)
        if self._active < self.flushers:
            self._active += 1
            self._tasks.add(task := asyncio.create_task(self._flush()))
            task.add_done_callback(self._tasks.discard)
        await pending.done

    async def _flush(self) -> None:
        try:
            await self._drain()
        finally:
            self._active -= 1

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            started = time.perf_counter()
            try:
                conflicts = await self._write_batch([p.transition for p in batch])
                self.stats["flush_s"] += time.perf_counter() - started
            except Exception as exc:
                for p in batch:
                    if not p.done.done():
                        p.done.set_exception(exc)
                continue
            self.stats["batches"] += 1
            self.stats["transitions"] += len(batch)
            for p in batch:
                if p.done.done():
                    continue
                if p.transition.run.run_id in conflicts:
                    p.done.set_exception(VersionConflict(f"run {p.transition.run.run_id} moved on concurrently"))
                else:
                    p.done.set_result(None)

    async def _write_batch(self, batch: list[Transition]) -> set[str]:
        """One round trip: the batch as one JSON document for ``agentstream_record_transitions``
        (migration 0003), which writes it in one transaction and returns the conflicting runs."""
        doc = {
            "new_runs": [_run(t.run) for t in batch if t.run.expected_version is None],
            "updates": [_run(t.run) for t in batch if t.run.expected_version is not None],
            "events": [_event(e) for t in batch for e in t.events],
            "sources": [{"run_id": t.run.run_id, "event_id": s.event_id, "partition": s.partition,
                         "offset": s.offset, "appended_at": s.appended_at, "consumed_at": s.consumed_at,
                         "consumed_by": s.consumed_by}
                        for t in batch for s in t.sources],
            "steps_requested": [{"step_id": r.step_id, "run_id": r.run_id, "step_index": r.step_index,
                                 "kind": r.kind, "request": r.request, "requested_at": r.requested_at}
                                for t in batch for r in t.steps_requested],
            "steps_completed": [{"run_id": t.run.run_id, "step_id": c.step_id, "status": c.status,
                                 "result": c.result, "error": c.error, "completed_at": c.completed_at}
                                for t in batch for c in t.steps_completed],
        }
        conflicts = await self.writer.fetchval("SELECT agentstream_record_transitions($1::jsonb)", to_json(doc))
        return set(conflicts or ())


def _run(r: RunRow) -> dict[str, Any]:
    return {"run_id": r.run_id, "status": r.status, "task": r.task, "state": r.state, "version": r.version,
            "expected": r.expected_version, "step_count": r.step_count, "answer": r.answer,
            "error_code": r.error_code, "error": r.error, "traceparent": r.traceparent,
            "submitted_at": r.submitted_at, "updated_at": r.updated_at, "finished_at": r.finished_at}


def _event(e: EventRow) -> dict[str, Any]:
    ev = e.event
    return {"event_id": ev.event_id, "run_id": ev.run_id, "step_id": ev.step_id,
            "event_type": type(ev).__name__, "topic": e.topic, "partition": e.partition, "offset": e.offset,
            "produced_at": ev.created_at, "appended_at": e.appended_at, "consumed_at": e.consumed_at,
            "consumed_by": e.consumed_by,
            "producer": f"{ev.producer.service}@{ev.producer.instance}", "traceparent": e.traceparent,
            "payload": _payload(ev)}


def _payload(event: Event) -> dict[str, Any]:
    """The event's own fields (the envelope has columns of its own). A model request's conversation
    is not repeated in every event (it would grow with the square of the steps): the run's state row
    holds it; the event keeps the message count and the newest message."""
    data = event.to_dict()
    for key in ("event_id", "run_id", "step_id", "created_at", "producer"):
        data.pop(key, None)
    if isinstance(event, InferenceRequested):
        messages = data.pop("messages")
        data["message_count"] = len(messages)
        data["last_message"] = messages[-1] if messages else None
    return data
