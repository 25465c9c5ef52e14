"""A run's state: everything the planner needs to take the run's next step, and nothing derivable.

Stored as JSON in ``runs.state`` (PostgreSQL) after every transition, and published as ``RunStateSnapshot``
to the compacted ``agent.runs`` topic (when: services/planner/snapshots.py).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from agentstream.streams.core.events import Message, RunStateSnapshot
from agentstream.streams.core.kinds import OnToolError, PendingKind, RunOutcome, RunStatus

RUNNING: Final = "running"  # a step is pending (model, tool or retrieval)
AWAITING_APPROVAL: Final = "awaiting_approval"  # a tool call waits for a person; no worker holds the run
COMPLETED: Final = "completed"
FAILED: Final = "failed"
TERMINAL: Final[frozenset[RunOutcome]] = frozenset({COMPLETED, FAILED})


@dataclass(frozen=True, kw_only=True)
class ToolRequest:
    """The pending tool call: what the model asked for and, once a person approved it, who did.

    In JSON (``runs.state``): ``{"tool", "arguments"}``, plus ``"approved_by"`` only once approved — the
    tool service's claim (streams/store/tool_calls.py) reads the call from there and takes the key's
    presence as the approval."""

    tool: str
    arguments: dict[str, Any]
    approved_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"tool": self.tool, "arguments": self.arguments}
        if self.approved_by is not None:
            data["approved_by"] = self.approved_by
        return data


@dataclass(frozen=True, kw_only=True)
class RetrievalRequest:
    """The pending retrieval: its query and how many passages. ``prefetch``: the speculative retrieval
    answers it (no search of its own); ``asked_at``: when the model asked, if it waits for that retrieval.

    In JSON: ``{"query", "k"}``, plus ``"prefetch": true`` and ``"asked_at"`` (ISO 8601) only when set."""

    query: str
    k: int
    prefetch: bool = False
    asked_at: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"query": self.query, "k": self.k}
        if self.prefetch:
            data["prefetch"] = True
        if self.asked_at is not None:
            data["asked_at"] = self.asked_at.isoformat()
        return data


#: What the pending step asks for; None for a model step (its request is the conversation) and when
#: nothing is pending. In JSON, None is ``{}``.
PendingRequest = ToolRequest | RetrievalRequest | None


def request_to_dict(request: PendingRequest) -> dict[str, Any]:
    """``request`` as ``runs.state`` holds it (see ``ToolRequest``, ``RetrievalRequest``)."""
    return {} if request is None else request.to_dict()


def request_from_dict(data: dict[str, Any] | None) -> PendingRequest:
    """The request a run's stored state holds: a tool call has a ``tool``, a retrieval a ``query``, and
    anything else (``{}``) is None. Raises ``TypeError`` or ``KeyError`` for a shape it does not know."""
    if not data:
        return None
    if "tool" in data:
        return ToolRequest(**data)
    asked = data.get("asked_at")
    return RetrievalRequest(**{**data, "asked_at": datetime.fromisoformat(asked) if asked else None})


@dataclass(frozen=True, kw_only=True)
class PrefetchServed:
    """The retrieval step that the speculative retrieval answered: which step, its query, the time
    it saved (ms) and whether the model's request waited for it (``waited``) or found it ready.

    In JSON: ``{"step_id", "step_index", "query", "saved_ms", "waited"}``, in that order."""

    step_id: str
    step_index: int
    query: str
    saved_ms: float
    waited: bool

    def to_dict(self) -> dict[str, Any]:
        return {"step_id": self.step_id, "step_index": self.step_index, "query": self.query,
                "saved_ms": self.saved_ms, "waited": self.waited}


@dataclass(frozen=True, kw_only=True)
class RunState:
    run_id: str
    status: RunStatus
    task: str
    tools: tuple[str, ...]
    max_steps: int
    deadline: datetime | None
    #: The latest the run may end even without a deadline (its start plus the maximum run duration).
    expires_at: datetime | None = None
    model: str | None
    system_prompt: str | None
    #: Steps published so far; the pending step (if any) is step ``step_index``.
    step_index: int
    pending_step_id: str | None
    pending_kind: PendingKind | None
    #: The step whose result was applied last (the parent of the pending step).
    last_step_id: str | None = None
    #: The event applied last: a redelivered copy of it makes the planner republish this state's
    #: outputs (the crash may have come between the database commit and the publish).
    last_event_id: str | None = None
    #: The pending step's request payload (tool name and arguments, retrieval query), so the request
    #: can be republished identically after a crash.
    pending_request: PendingRequest = None
    messages: tuple[Message, ...] = ()
    #: The JSON schema of an action for this run (its allowed tools), sent with every model request.
    response_schema: str | None = None
    answer: str | None = None
    error: str | None = None
    error_code: str | None = None
    parse_failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    version: int = 0
    submitted_at: datetime
    updated_at: datetime
    traceparent: str | None = None
    #: Tools of this run that need a person's approval before each call.
    approval_tools: tuple[str, ...] = ()
    #: After a tool's last retry failed: "tell_model" (it decides what next) or "fail_run".
    on_tool_error: OnToolError = "tell_model"
    #: Speculative retrieval for the task text, started with the first model call:
    #: off | pending (asked) | ready (passages here) | used.
    prefetch: str = "off"
    prefetched: tuple[dict[str, Any], ...] = ()
    prefetch_error: str | None = None
    prefetch_sent_at: datetime | None = None
    prefetch_ready_at: datetime | None = None
    #: The retrieval step the prefetch answered.
    prefetch_served: PrefetchServed | None = None
    #: The run this one replays or forks, if any.
    replay_of: str | None = None
    #: The topic prefix of the pipeline that runs it: planners of other prefixes (a replay session, a
    #: test) share the database and must never adopt it (deadlines, restarts).
    topic_prefix: str = ""

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def waits_for_prefetch(self) -> bool:
        """The pending step is a retrieval that the speculative retrieval is to answer (nothing to publish)."""
        request = self.pending_request
        return isinstance(request, RetrievalRequest) and request.prefetch

    def evolve(self, **changes: Any) -> RunState:
        """The next version of the state, with ``changes``."""
        return self.changed(version=self.version + 1, **changes)

    def changed(self, **changes: Any) -> RunState:
        """``dataclasses.replace(self, **changes)`` without ``__init__``: a frozen dataclass sets each of
        its 36 fields through ``object.__setattr__``, and a transition copies the state two to four
        times (6 % of the planner's CPU under load, py-spy). There are no defaults to fill in and no
        ``__post_init__``; unknown names are refused, as ``replace`` refuses them."""
        unknown = changes.keys() - _FIELD_SET
        if unknown:
            raise TypeError(f"RunState has no field {', '.join(sorted(unknown))}")
        new = object.__new__(RunState)
        new.__dict__.update(self.__dict__, **changes)
        return new

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (timestamps as ISO strings). Written for every transition, so no deep copy."""
        data = {name: getattr(self, name) for name in _FIELDS}
        data["tools"] = list(self.tools)
        data["approval_tools"] = list(self.approval_tools)
        data["prefetched"] = list(self.prefetched)
        data["messages"] = [{"role": m.role, "content": m.content, "name": m.name} for m in self.messages]
        data["pending_request"] = request_to_dict(self.pending_request)
        if self.prefetch_served is not None:
            data["prefetch_served"] = self.prefetch_served.to_dict()
        for key in _TIMES:
            data[key] = data[key].isoformat() if data[key] else None
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, raw: str | dict) -> RunState:
        data = json.loads(raw) if isinstance(raw, str) else dict(raw)
        for key in _TIMES:
            data[key] = datetime.fromisoformat(data[key]) if data.get(key) else None
        data["tools"] = tuple(data["tools"])
        data["approval_tools"] = tuple(data.get("approval_tools", ()))
        data["prefetched"] = tuple(data.get("prefetched", ()))
        data["messages"] = tuple(Message(**m) for m in data["messages"])
        data["pending_request"] = request_from_dict(data.get("pending_request"))
        served = data.get("prefetch_served")
        data["prefetch_served"] = PrefetchServed(**served) if served else None
        return cls(**data)

    def snapshot(self, *, service: str) -> RunStateSnapshot:
        return RunStateSnapshot.build(
            run_id=self.run_id, step=f"{self.run_id}:snapshot:{self.version}", service=service,
            created_at=self.updated_at, status=self.status, task=self.task, tools=list(self.tools),
            max_steps=self.max_steps, deadline=self.deadline, model=self.model,
            system_prompt=self.system_prompt, step_index=self.step_index,
            pending_step_id=self.pending_step_id, pending_kind=self.pending_kind,
            messages=list(self.messages), answer=self.answer, error=self.error, error_code=self.error_code,
            parse_failures=self.parse_failures, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, version=self.version,
            submitted_at=self.submitted_at, updated_at=self.updated_at, traceparent=self.traceparent,
        )


_FIELDS = tuple(f.name for f in dataclasses.fields(RunState))
_FIELD_SET = frozenset(_FIELDS)
_TIMES = ("deadline", "expires_at", "submitted_at", "updated_at", "prefetch_sent_at", "prefetch_ready_at")
