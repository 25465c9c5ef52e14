"""PostgreSQL sessions: each conversation's transcript (``sessions``, migration 0018) and its turns' order.

The planner writes a session in the same transaction as the transition of one of its turns
(``SessionWrite``, carried by ``history.Transition``): a turn's arrival opens the session (a row with
no turns, if there is none), and a turn that completes replaces the turns with the transcript it ended
with — if the session's epoch is still the one the turn started in. ``agentstream session delete``
(``delete``) erases the turns and moves the epoch on in one statement, so a turn of the deleted session
that ends later writes nothing, and a turn still to begin fails with ``session_deleted``.

Which turns are still to run is not stored apart: it is the session's runs that have not ended
(``active_turns``), ordered by their place in the queue (``session_seq``: the offset of the turn's task on
the session's partition).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import asyncpg
import orjson

from agentstream.streams.core.kinds import RunStatus


@dataclass(frozen=True, kw_only=True)
class SessionRow:
    """A session as ``sessions`` holds it. ``turns``: ``{"run_id", "user", "reply", "answer", "tokens"}``
    each, oldest first; ``summary``: a model's summary of the turns folded out of them (``overflow =
    summarise``; stored as a first ``{"summary", "tokens"}`` entry of the ``turns`` column); ``deleted_at``:
    when it was last deleted (its turns are empty since, unless a turn has begun it again: then None)."""

    session_id: str
    prefix: str
    epoch: int
    turns: list[dict[str, Any]]
    dropped: int
    tokens: int
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None
    last_run_id: str | None = None
    summary: str = ""


@dataclass(frozen=True, kw_only=True)
class TurnRef:
    """A turn of a session that has not ended: its run, status and place in the session's queue."""

    run_id: str
    status: RunStatus
    seq: int


@dataclass(frozen=True, kw_only=True)
class SessionWrite:
    """What a transition writes to its session: ``open`` (a turn arrived: create the session if it does not
    exist, and begin it again if it was deleted) or ``append`` (a turn completed: its transcript replaces the
    session's, if the session is still in ``epoch``)."""

    kind: Literal["open", "append"]
    prefix: str
    session_id: str
    run_id: str
    epoch: int = 0
    turns: Sequence[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0
    tokens: int = 0
    at: datetime

    def to_doc(self) -> dict[str, Any]:
        """The entry of the batch document ``agentstream_record_transitions`` reads (``sessions``)."""
        return {"kind": self.kind, "prefix": self.prefix, "session_id": self.session_id, "run_id": self.run_id,
                "epoch": self.epoch, "turns": list(self.turns), "dropped": self.dropped, "tokens": self.tokens,
                "at": self.at}


_COLUMNS = ("session_id, prefix, epoch, turns::text AS turns, dropped, tokens, created_at, updated_at, deleted_at, "
            "last_run_id")


def _row(record: asyncpg.Record | dict[str, Any]) -> SessionRow:
    data = dict(record)
    turns = orjson.loads(data["turns"]) if data["turns"] else []
    data["summary"] = next((str(t["summary"]) for t in turns if "summary" in t), "")
    data["turns"] = [t for t in turns if "summary" not in t]
    return SessionRow(**data)


async def load(pool: asyncpg.Pool, prefix: str, session: str) -> SessionRow | None:
    """The session ``session`` of the pipeline on ``prefix``, or None when it never had a turn."""
    record = await pool.fetchrow(f"SELECT {_COLUMNS} FROM sessions WHERE prefix = $1 AND session_id = $2",
                                 prefix, session)
    return _row(record) if record is not None else None


async def active_turns(pool: asyncpg.Pool, prefix: str, session: str) -> list[TurnRef]:
    """The session's turns that have not ended (running, waiting for approval or queued), in queue order."""
    rows = await pool.fetch(
        """SELECT run_id, status, coalesce((state->>'session_seq')::bigint, 0) AS seq FROM runs
           WHERE state->>'session' = $2 AND status NOT IN ('completed', 'failed')
             AND coalesce(state->>'topic_prefix', '') = $1
           ORDER BY seq, submitted_at""", prefix, session)
    return [TurnRef(run_id=r["run_id"], status=r["status"], seq=r["seq"]) for r in rows]


async def with_turns(pool: asyncpg.Pool, prefix: str, session: str) -> tuple[SessionRow | None, list[TurnRef]]:
    """``load`` and ``active_turns`` in one round trip: what a turn's arrival needs to know (the planner
    asks it for every turn, so it is one query, not two)."""
    record = await pool.fetchrow(
        f"""SELECT {_COLUMNS}, (SELECT coalesce(json_agg(json_build_array(run_id, status, seq) ORDER BY seq, at), '[]')::text
                   FROM (SELECT run_id, status, coalesce((state->>'session_seq')::bigint, 0) AS seq, submitted_at AS at
                         FROM runs WHERE state->>'session' = $2 AND status NOT IN ('completed', 'failed')
                           AND coalesce(state->>'topic_prefix', '') = $1) t) AS going
            FROM (SELECT 1) one LEFT JOIN sessions ON prefix = $1 AND session_id = $2""", prefix, session)
    assert record is not None  # (one row: the LEFT JOIN's)
    going = [TurnRef(run_id=r, status=st, seq=q) for r, st, q in orjson.loads(record["going"])]
    data = dict(record)
    del data["going"]
    return (_row(data) if data["session_id"] is not None else None), going


async def listing(pool: asyncpg.Pool, prefix: str, *, limit: int = 50) -> list[SessionRow]:
    """The pipeline's sessions, the most recently updated first (deleted ones with no turn since left out)."""
    rows = await pool.fetch(f"SELECT {_COLUMNS} FROM sessions WHERE prefix = $1 AND deleted_at IS NULL "
                            "ORDER BY updated_at DESC LIMIT $2", prefix, limit)
    return [_row(r) for r in rows]


async def delete(pool: asyncpg.Pool, prefix: str, session: str) -> list[str] | None:
    """Erase the session's transcript and move its epoch on (``agentstream_delete_session``, one statement);
    return the runs of its turns that have not ended (to be stopped), or None when there is no such session."""
    found: list[str] | None = await pool.fetchval("SELECT agentstream_delete_session($1, $2)", prefix, session)
    return found


__all__ = ["SessionRow", "SessionWrite", "TurnRef", "active_turns", "delete", "listing", "load", "with_turns"]
