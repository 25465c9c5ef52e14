"""The fields ``AgentClient.submit`` takes in forms convenient to a caller (a deadline as seconds, an
output schema as a mapping, a session turn's run id), turned into what the task carries, or refused with
``TaskRejected`` before anything is published."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from agentstream.streams.core.errors import TaskRejected
from agentstream.streams.kafka.topics import Topics


def session_run_problem(topics: Topics, session: str | None, run_id: str | None) -> str | None:
    """Why ``run_id`` cannot be a turn of ``session``: every turn of a session is on its partition."""
    if session is None or run_id is None or topics.partition_for(run_id) == topics.partition_for(session):
        return None
    return (f"the run id {run_id!r} is on partition {topics.partition_for(run_id)}, not on session {session!r}'s "
            f"({topics.partition_for(session)}): leave run_id out, or draw one with Topics.run_id_for_session")


def schema_text(schema: str | Mapping[str, Any] | None) -> str | None:
    """An output schema as the task carries it: JSON text (a mapping is encoded; anything else is left
    for the task rules to refuse)."""
    if isinstance(schema, Mapping):
        try:
            return json.dumps(schema, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TaskRejected(f"the output schema cannot be written as JSON: {exc}") from exc
    return schema


def deadline_of(deadline: datetime | timedelta | float | None) -> datetime | None:
    if deadline is None:
        return None
    now = datetime.now(UTC)
    if isinstance(deadline, bool):
        raise TaskRejected("deadline must be a datetime, a timedelta or seconds")
    if isinstance(deadline, (int, float)):
        deadline = timedelta(seconds=deadline)
    if isinstance(deadline, timedelta):
        deadline = now + deadline
    if not isinstance(deadline, datetime):
        raise TaskRejected("deadline must be a datetime, a timedelta or seconds")
    if deadline.tzinfo is None:
        raise TaskRejected("deadline must be timezone-aware")
    if deadline <= now:
        raise TaskRejected("the deadline has already passed")
    return deadline
