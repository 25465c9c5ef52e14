"""PostgreSQL history: runs, steps and events, written by the planner one transition at a time.

Transitions from many runs are written together (group commit): while one batch is being written the
next one gathers, so under load one transaction (and one WAL flush) carries many transitions, and at
low load a transition is written at once. A batch is one round trip: a JSON document handed to the
``agentstream_record_transitions`` function. Each caller still waits for its own transition to commit.
A run's row is updated only if its version is the one the transition started from; otherwise that
transition raises ``VersionConflict`` (retriable: the planner reloads and re-decides).

Fencing: a transition carries the partition lease of the planner that made it (``Lease``); the batch
function refuses it when another planner has taken the partition since (``Fenced``). One run's bad
data (a value PostgreSQL refuses) never fails the others' transitions: a batch that fails for its
data is split until the failing transition is alone, and only that one raises ``TransitionRejected``.
Text that PostgreSQL cannot store (NUL characters, lone surrogates) is replaced before it is sent.

Benchmark hooks, both off unless asked for and both decided at construction, never per write:
``capture`` (by default ``AGENTSTREAM_HISTORY_CAPTURE``, a file path, read then) appends every batch
document to that file, one JSON document a line — what ``bench/perf/history_write.py`` replays to
measure the history function; ``stages`` (the worker hands its ``Runtime.stages``) times the commits
for ``bench/perf/pipeline.py --breakdown``.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import asyncpg
import orjson

from agentstream.streams.core.errors import TransitionRejected, VersionConflict
from agentstream.streams.core.events import Event, InferenceRequested
from agentstream.streams.core.ids import uuid5_str
from agentstream.streams.core.kinds import RunStatus, StepOutcome
from agentstream.streams.core.outages import outage_of
from agentstream.streams.core.signals import Fenced
from agentstream.streams.store import sessions
from agentstream.streams.store.sessions import SessionRow, SessionWrite, TurnRef

if TYPE_CHECKING:
    from agentstream.streams.telemetry.stages import StageClock


class RunColumns(TypedDict):
    """The columns of a run's row in ``runs`` that readers get back (``AgentClient.status``, replay)."""

    run_id: str
    status: RunStatus
    task: str
    step_count: int
    answer: str | None
    error_code: str | None
    error: str | None
    submitted_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class Lease:
    """A planner's hold on partition ``partition`` of the pipeline on ``prefix``, since ``epoch``."""

    prefix: str
    partition: int
    epoch: int


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
    #: A ``kinds.StepKind`` (str: the planner's run state holds it as a str).
    kind: str
    request: dict[str, Any]
    requested_at: datetime


@dataclass(frozen=True, kw_only=True)
class StepResult:
    step_id: str
    status: StepOutcome
    result: dict[str, Any]
    error: str | None
    completed_at: datetime


@dataclass(frozen=True, kw_only=True)
class RunRow:
    run_id: str
    #: A ``kinds.RunStatus`` (str: the planner's run state holds it as a str).
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
    #: The lease this transition was decided under (None: unfenced, e.g. a tool writing outside a planner).
    lease: Lease | None = None
    #: What the transition writes to its session (a turn of a session: streams/store/sessions.py).
    session: SessionWrite | None = None


@dataclass
class _Pending:
    transition: Transition
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def to_json(value: Any) -> str:
    """JSON for PostgreSQL (orjson: datetimes as ISO 8601, bytes as base64). A batch document is
    built for every group commit, so the encoder's speed shows in the planner's CPU profile.

    PostgreSQL's ``jsonb`` and ``text`` refuse NUL characters and lone surrogates, which a model, a tool
    or a third-party producer can put in any string; they become U+FFFD here, so one run's odd text can
    never fail a write. The checks cost one substring search when there is nothing to fix."""
    try:
        text = orjson.dumps(value, default=_json_default).decode()
    except orjson.JSONEncodeError:  # a str with lone surrogates is not valid UTF-8
        text = orjson.dumps(_scrub(value), default=_json_default).decode()
    if "\\u0000" in text:
        text = _ESCAPED_NUL.sub(_replace_nul, text)
    return text


def pg_text(value: str | None) -> str | None:
    """``value`` as PostgreSQL ``text`` can store it (no NUL, no lone surrogates)."""
    if value is None:
        return None
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode()
    except UnicodeEncodeError:
        value = _clean(value)
    return value


#: A run of backslashes before u0000: an odd count means the last one escapes a NUL.
_ESCAPED_NUL = re.compile(r"(\\+)u0000")


def _replace_nul(match: re.Match[str]) -> str:
    slashes = match.group(1)
    return slashes + "u0000" if len(slashes) % 2 == 0 else slashes[:-1] + "\\ufffd"


def _clean(text: str) -> str:
    """Pairs of surrogates become their character, lone ones U+FFFD."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return _clean(value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


#: A file every batch document is appended to (for bench/perf/history_write.py); unset: none.
CAPTURE_ENV = "AGENTSTREAM_HISTORY_CAPTURE"


class _Default(enum.Enum):
    """``TransitionStore(capture=...)`` left out: as ``AGENTSTREAM_HISTORY_CAPTURE`` says then."""

    FROM_ENV = "from the environment"


class TransitionStore:
    """Reads go through ``pool``; batches are written on ``writer`` by at most ``flushers`` concurrent
    flushes (give the writer that many connections, kept warm so the function's plans stay cached).
    Two flushes overlap one batch's commit with the next batch's gathering. ``stages`` and ``capture``
    are the benchmark hooks (see the module's docstring)."""

    def __init__(self, pool: asyncpg.Pool, writer: asyncpg.Pool | None = None, *, max_batch: int = 500,
                 flushers: int = 2, stages: StageClock | None = None,
                 capture: str | Path | _Default | None = _Default.FROM_ENV) -> None:
        self.pool = pool
        self.writer = writer or pool
        self.max_batch = max_batch
        self.flushers = flushers
        self._queue: list[_Pending] = []
        self._active = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = {"batches": 0, "transitions": 0, "flush_s": 0.0}
        #: Times ``planner.history_write`` and ``planner.history_batch`` (None: off).
        self._stages = stages
        if isinstance(capture, _Default):
            capture = os.environ.get(CAPTURE_ENV) or None
        # One unbuffered O_APPEND write a document: a worker stopped by a signal loses no captured batch,
        # and the planners of a group capturing into one file never interleave their lines.
        self._capture = os.open(capture, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if capture else None

    async def load_state(self, run_id: str) -> str | None:
        """The run's state JSON, or None for a run never recorded."""
        state: str | None = await self.pool.fetchval("SELECT state::text FROM runs WHERE run_id = $1", run_id)
        return state

    async def load_session(self, topic_prefix: str, session: str) -> SessionRow | None:
        """The session ``session`` of the pipeline on ``topic_prefix`` (streams/store/sessions.py)."""
        return await sessions.load(self.pool, topic_prefix, session)

    async def session_with_turns(self, topic_prefix: str, session: str) -> tuple[SessionRow | None, list[TurnRef]]:
        """The session and its turns that have not ended, in one round trip (streams/store/sessions.py)."""
        return await sessions.with_turns(self.pool, topic_prefix, session)

    async def session_turns(self, topic_prefix: str, session: str) -> list[TurnRef]:
        """The session's turns that have not ended, in queue order (streams/store/sessions.py)."""
        return await sessions.active_turns(self.pool, topic_prefix, session)

    async def active_states(self, topic_prefix: str = "") -> list[str]:
        """The unfinished runs of the pipeline on ``topic_prefix`` (replays and tests share the database)."""
        rows = await self.pool.fetch(
            "SELECT state::text AS s FROM runs WHERE status NOT IN ('completed', 'failed')"
            " AND coalesce(state->>'topic_prefix', '') = $1", topic_prefix)
        return [r["s"] for r in rows]

    async def write(self, transition: Transition) -> None:
        """Commit one transition (batched with concurrent ones); raises ``VersionConflict``."""
        clock = self._stages
        started = time.perf_counter()
        pending = _Pending(transition)
        self._queue.append(pending)
        if self._active < self.flushers:
            self._active += 1
            self._tasks.add(task := asyncio.create_task(self._flush()))
            task.add_done_callback(self._tasks.discard)
        await pending.done
        if clock is not None:
            clock.since("planner.history_write", started)

    async def _flush(self) -> None:
        try:
            await self._drain()
        finally:
            self._active -= 1

    async def _drain(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[: self.max_batch], self._queue[self.max_batch :]
            started = time.perf_counter()
            await self._settle(batch)
            self.stats["flush_s"] += time.perf_counter() - started
            if (clock := self._stages) is not None:
                clock.since("planner.history_batch", started)
                clock.add("planner.history_batch_size", len(batch) / 1000)

    async def _settle(self, batch: list[_Pending]) -> None:
        """Write ``batch`` and resolve each caller. A batch PostgreSQL refuses for its data is split in
        halves until the refused transitions are alone, so the others are written (isolation)."""
        try:
            conflicts, fenced = await self._write_batch([p.transition for p in batch])
        except Exception as exc:
            refused = _refused_for_data(exc)
            if refused and len(batch) > 1:
                middle = len(batch) // 2
                await self._settle(batch[:middle])
                await self._settle(batch[middle:])
                return
            error: BaseException = exc
            if refused:
                run_id = batch[0].transition.run.run_id
                error = TransitionRejected(f"PostgreSQL refused the transition of {run_id}: "
                                           f"{type(exc).__name__}: {exc}")
            for p in batch:
                if not p.done.done():
                    p.done.set_exception(error)
            return
        self.stats["batches"] += 1
        self.stats["transitions"] += len(batch)
        for p in batch:
            if p.done.done():
                continue
            run_id = p.transition.run.run_id
            if run_id in fenced:
                p.done.set_exception(Fenced(f"run {run_id}: this planner's lease on its partition was taken over"))
            elif run_id in conflicts:
                p.done.set_exception(VersionConflict(f"run {run_id} moved on concurrently"))
            else:
                p.done.set_result(None)

    async def _write_batch(self, batch: list[Transition]) -> tuple[set[str], set[str]]:
        """One round trip: the batch as one JSON document for ``agentstream_record_transitions``
        (migrations 0003, 0008), which writes it in one transaction and returns the runs whose version
        check failed and those whose lease is stale."""
        doc = {
            "leases": [{"run_id": t.run.run_id, "prefix": t.lease.prefix, "partition": t.lease.partition,
                        "epoch": t.lease.epoch} for t in batch if t.lease is not None],
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
            "sessions": [t.session.to_doc() for t in batch if t.session is not None],
        }
        text = to_json(doc)
        if self._capture is not None:
            os.write(self._capture, (text + "\n").encode())
        raw = await self.writer.fetchval("SELECT agentstream_record_transitions($1::jsonb)::text", text)
        result = orjson.loads(raw) if raw else {}
        return set(result.get("conflicts") or ()), set(result.get("fenced") or ())

    # -- leases (fencing) ------------------------------------------------------------------------
    async def acquire_lease(self, prefix: str, partition: int, owner: str) -> Lease:
        """Take partition ``partition`` over: a new epoch, which fences every earlier holder. Waits for
        transitions in flight under the old epoch (they hold the row FOR SHARE), so the caller's next
        read of the runs sees them."""
        epoch = await self.writer.fetchval(
            """INSERT INTO planner_leases (prefix, partition, epoch, owner) VALUES ($1, $2, 1, $3)
               ON CONFLICT (prefix, partition) DO UPDATE
                   SET epoch = planner_leases.epoch + 1, owner = EXCLUDED.owner, acquired_at = now()
               RETURNING epoch""", prefix, partition, owner)
        return Lease(prefix, partition, epoch)

    async def recorded_decision(self, run_id: str, step_id: str) -> tuple[bool, str, str] | None:
        """The decision an approver's login recorded on ``step_id`` (``agentstream_decide``): approved,
        reason, who; None when nobody did."""
        row = await self.pool.fetchrow("SELECT approved, reason, decided_by FROM approval_decisions "
                                       "WHERE run_id = $1 AND step_id = $2", run_id, step_id)
        return (bool(row["approved"]), str(row["reason"]), str(row["decided_by"])) if row is not None else None

    async def lease_is_current(self, lease: Lease) -> bool:
        epoch: int | None = await self.pool.fetchval("SELECT epoch FROM planner_leases WHERE prefix = $1 AND partition = $2",
                                         lease.prefix, lease.partition)
        return epoch == lease.epoch

    async def active_count(self, topic_prefix: str = "") -> int:
        """How many runs of the pipeline on ``topic_prefix`` have not ended (its runs-in-flight quota)."""
        count: int = await self.pool.fetchval(
            "SELECT count(*) FROM runs WHERE status NOT IN ('completed', 'failed')"
            " AND coalesce(state->>'topic_prefix', '') = $1", topic_prefix)
        return count

    async def stalled(self, topic_prefix: str, *, idle_s: float) -> list[str]:
        """The states of the pipeline's runs the sweeper must look at: running runs that have not moved
        for ``idle_s`` seconds (to re-drive), and active runs past their deadline or maximum duration
        (to expire; a run waiting for a person is not stalled before that)."""
        rows = await self.pool.fetch(
            """SELECT state::text AS s FROM runs
               WHERE status NOT IN ('completed', 'failed') AND coalesce(state->>'topic_prefix', '') = $1
                 AND ((status = 'running' AND updated_at < now() - make_interval(secs => $2))
                      OR (state->>'deadline')::timestamptz <= now() OR (state->>'expires_at')::timestamptz <= now())""",
            topic_prefix, idle_s)
        return [r["s"] for r in rows]


def _refused_for_data(exc: BaseException) -> bool:
    """PostgreSQL refused the batch for what it holds (a value, a constraint, a size), not because it
    is unreachable or busy: splitting the batch finds the culprit."""
    if not isinstance(exc, asyncpg.PostgresError) or outage_of(exc) is not None:
        return False
    return not isinstance(exc, (asyncpg.exceptions.SerializationError, asyncpg.exceptions.DeadlockDetectedError,
                                asyncpg.exceptions.QueryCanceledError))


def _run(r: RunRow) -> dict[str, Any]:
    return {"run_id": r.run_id, "status": r.status, "task": r.task, "state": r.state, "version": r.version,
            "expected": r.expected_version, "step_count": r.step_count, "answer": r.answer,
            "error_code": r.error_code, "error": r.error, "traceparent": r.traceparent,
            "submitted_at": r.submitted_at, "updated_at": r.updated_at, "finished_at": r.finished_at}


def _event(e: EventRow) -> dict[str, Any]:
    ev = e.event
    return {"event_id": event_uuid(ev.event_id), "run_id": ev.run_id, "step_id": ev.step_id,
            "event_type": type(ev).__name__, "topic": e.topic, "partition": e.partition, "offset": e.offset,
            "produced_at": ev.created_at, "appended_at": e.appended_at, "consumed_at": e.consumed_at,
            "consumed_by": e.consumed_by,
            "producer": f"{ev.producer.service}@{ev.producer.instance}", "traceparent": e.traceparent,
            "payload": _payload(ev)}


_FOREIGN_IDS = uuid.UUID("0b0c8f5e-2d1b-4f3e-9a7c-6f1d2e3c4b5a")
_CANONICAL_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def event_uuid(event_id: str) -> str:
    """The ``events.event_id`` (uuid) of an event: its own id, or, for an id a third-party producer made
    that is not a UUID, a UUIDv5 of it (deterministic, so a copy is still recognised as the same)."""
    if _CANONICAL_UUID.fullmatch(event_id):  # ours (``event_id_for``): as it is, without parsing
        return event_id
    try:
        return str(uuid.UUID(event_id))
    except ValueError:
        return uuid5_str(_FOREIGN_IDS.bytes, event_id)


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
