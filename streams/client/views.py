"""What the client's read calls return: a run's details and steps (``status``), its recorded events
(``events``), and the model's text as it streams (``stream``). Plain typed records, so a caller's type
checker knows every field; the rows come from PostgreSQL (migrations) and ``agent.tokens``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from agentstream.streams.core.kinds import StepKind, StepStatus
from agentstream.streams.store.history import RunColumns


@dataclass(frozen=True)
class TokenEvent:
    """Text a model generated for one of the run's steps."""

    offset: int  # in agent.tokens: resume with from_offset=offset + 1
    step_id: str
    seq: int
    text: str


class StepDetails(TypedDict):
    """One of a run's steps (a row of ``steps``), as ``AgentClient.status`` returns it."""

    step_index: int
    kind: StepKind
    status: StepStatus
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    requested_at: datetime
    completed_at: datetime | None


class RunDetails(RunColumns):
    """A run (its row of ``runs``) and its steps, as ``AgentClient.status`` returns it."""

    steps: list[StepDetails]


class RecordedEvent(TypedDict):
    """One recorded event of a run (a row of ``events``), as ``AgentClient.events`` returns it."""

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
    producer: str  # "{service}@{instance}"
    payload: dict[str, Any]
