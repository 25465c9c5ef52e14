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

from agentstream.streams.core.events import Message, RunStateSnapshot, ToolCall
from agentstream.streams.core.kinds import OnToolError, PendingKind, RunOutcome, RunStatus

RUNNING: Final = "running"  # a step is pending (model, tool or retrieval)
AWAITING_APPROVAL: Final = "awaiting_approval"  # a tool call waits for a person; no worker holds the run
QUEUED: Final = "queued"  # a turn of a session waits for the session's previous turn to end
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
    #: The id the model gave the call (native tool calling; ``"call_id"`` in JSON only when set).
    call_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"tool": self.tool, "arguments": self.arguments}
        if self.approved_by is not None:
            data["approved_by"] = self.approved_by
        if self.call_id is not None:
            data["call_id"] = self.call_id
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


@dataclass(frozen=True, kw_only=True)
class SummaryRequest:
    """The pending model step that condenses a session's oldest turns (services/planner/summaries.py): its ``prompt``, the most tokens
    the summary may take, the session's ``budget`` the transcript must fit once it is back, and how many
    turns it folds.

    In JSON (``runs.state``): ``{"summarise": {"prompt", "max_tokens", "budget", "folded"}}``."""

    prompt: tuple[Message, ...]
    max_tokens: int
    budget: int
    folded: int

    def to_dict(self) -> dict[str, Any]:
        return {"summarise": {"prompt": [{"role": m.role, "content": m.content} for m in self.prompt],
                              "max_tokens": self.max_tokens, "budget": self.budget, "folded": self.folded}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SummaryRequest:
        body = data["summarise"]
        return cls(prompt=tuple(Message(role=m["role"], content=m["content"]) for m in body["prompt"]),
                   max_tokens=int(body["max_tokens"]), budget=int(body["budget"]), folded=int(body["folded"]))


def message_to_dict(m: Message) -> dict[str, Any]:
    """A message as ``runs.state`` holds it: ``{"role", "content", "name"}``, plus ``"tool_calls"`` and
    ``"tool_call_id"`` (native tool calling) only when set, so other states keep their stored shape."""
    data: dict[str, Any] = {"role": m.role, "content": m.content, "name": m.name}
    if m.tool_calls:
        data["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.tool_calls]
    if m.tool_call_id is not None:
        data["tool_call_id"] = m.tool_call_id
    return data


def message_from_dict(data: dict[str, Any]) -> Message:
    calls = [ToolCall(**c) for c in data.get("tool_calls") or ()]
    return Message(**{**data, "tool_calls": calls})


@dataclass(frozen=True, kw_only=True)
class PendingCall:
    """One call of a fan-out (``ToolBatch``): its own step (``{run}:{index}:tool``), tool and arguments;
    whether it waits for a person (``awaiting_approval``) or was approved (``approved_by``); once its
    result (or error, or a denial) is in, ``done`` and the message the model will see (``content``).

    In JSON: ``{"step_id", "tool", "arguments"}``, plus ``"awaiting_approval": true``, ``"approved_by"``,
    ``"done": true``, ``"content"`` and ``"call_id"`` only when set — the tool service's claim
    (streams/store/tool_calls.py) finds the call by ``step_id`` and reads these keys."""

    step_id: str
    tool: str
    arguments: dict[str, Any]
    awaiting_approval: bool = False
    approved_by: str | None = None
    done: bool = False
    content: str | None = None
    #: The id the model gave the call (native tool calling), echoed with its result.
    call_id: str | None = None

    @property
    def runnable(self) -> bool:
        """Waiting for its result, and free to run (not waiting for a person)."""
        return not self.done and not self.awaiting_approval

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"step_id": self.step_id, "tool": self.tool, "arguments": self.arguments}
        for key in ("approved_by", "content", "call_id"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.awaiting_approval:
            data["awaiting_approval"] = True
        if self.done:
            data["done"] = True
        return data


@dataclass(frozen=True, kw_only=True)
class ToolBatch:
    """The pending fan-out: the calls of one model reply (``asked_by``: that model step), in the order
    the model gave them, each its own step; the run waits until every one is ``done`` (services/planner/
    fanout.py). ``send``: the calls the state's transition publishes — all runnable ones when the calls
    fan out, the one a person just approved, none when a result comes in (the sweeper re-drives all
    runnable ones), so a republished state repeats exactly what its transition sent.

    In JSON: ``{"asked_by", "calls": [PendingCall...], "send": [step ids]}``."""

    asked_by: str
    calls: tuple[PendingCall, ...]
    send: tuple[str, ...] = ()

    def call(self, step: str) -> PendingCall | None:
        return next((c for c in self.calls if c.step_id == step), None)

    def to_dict(self) -> dict[str, Any]:
        return {"asked_by": self.asked_by, "calls": [c.to_dict() for c in self.calls], "send": list(self.send)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolBatch:
        return cls(asked_by=data["asked_by"], calls=tuple(PendingCall(**c) for c in data["calls"]),
                   send=tuple(data.get("send", ())))


#: What the pending step asks for; None for a model step (its request is the conversation) and when
#: nothing is pending. In JSON, None is ``{}``.
PendingRequest = ToolRequest | ToolBatch | RetrievalRequest | SummaryRequest | None


def request_to_dict(request: PendingRequest) -> dict[str, Any]:
    """``request`` as ``runs.state`` holds it (see ``ToolRequest``, ``RetrievalRequest``)."""
    return {} if request is None else request.to_dict()


def request_from_dict(data: dict[str, Any] | None) -> PendingRequest:
    """The request a run's stored state holds: a tool call has a ``tool``, a retrieval a ``query``, and
    several calls ``calls``, and anything else (``{}``) is None. Raises ``TypeError`` or ``KeyError`` for a
    shape it does not know."""
    if not data:
        return None
    if "calls" in data:
        return ToolBatch.from_dict(data)
    if "summarise" in data:
        return SummaryRequest.from_dict(data)
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
class Sampling:
    """How a run's model steps generate: its task's settings, with the planner's defaults filled in when
    the run started (streams/config/generation.py), so every request of the run, republished ones
    included, asks for the same. ``top_p`` and ``seed`` None, ``stop`` empty: the engine's own.

    In JSON: ``{"max_tokens", "temperature", "top_p", "stop", "seed"}``; a state recorded before these
    settings existed has none, and reads as the defaults it ran with (256 tokens, temperature 0)."""

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                "stop": list(self.stop), "seed": self.seed}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Sampling:
        return cls(**{**data, "stop": tuple(data.get("stop") or ())}) if data else cls()


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
    #: The most tool calls one model reply may ask for at once (``Settings.max_parallel_tool_calls`` when
    #: the run started; 1 for runs recorded before parallel calls).
    max_parallel_calls: int = 1
    #: How the model calls tools (streams/core/tool_calling.py): ``json`` actions, or ``native`` (the
    #: engine's tool calling, with the run's tools as ``native_tools``, OpenAI function tools as JSON text).
    tool_calling: str = "json"
    native_tools: str | None = None
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
    #: The session this run is a turn of (None: a run on its own), the session's epoch when the turn arrived
    #: (a delete moves it on) and the turn's place in the session's queue (its task's offset on the
    #: session's partition). services/planner/sessions.py.
    session: str | None = None
    session_epoch: int = 0
    session_seq: int = 0
    #: The transcript the turn started from (``transcript.Transcript.rows()``: its summary if any, then
    #: each turn, oldest first, within the session's token budget) and how many turns the session had
    #: dropped or summarised by then: recorded with the run, so the turn replays from the same transcript.
    session_turns: tuple[dict[str, Any], ...] = ()
    session_dropped: int = 0
    #: How every model step of the run generates (from its task and the planner's settings, when it started).
    sampling: Sampling = Sampling()
    #: The task's output schema (JSON text; streams/core/structured.py), and the answer as JSON text that
    #: matches it once the run completed; None for a text answer.
    output_schema: str | None = None
    output: str | None = None
    #: Final answers that did not match the output schema so far, and how many go back to the model before
    #: the run fails with ``invalid_output`` (``GenerationSettings.output_retries`` when it started).
    output_failures: int = 0
    output_retries: int = 2
    #: The agent definition the run uses, ``name@version`` (its task named an agent: services/planner/agents.py),
    #: and the retrieval collection its retrievals search (None: ``default``).
    agent: str | None = None
    collection: str | None = None
    #: The agents its model may call (``agent__{name}``) and hand the conversation to (``handoff__{name}``),
    #: as exact versions resolved when it started (services/planner/subagents.py).
    subagents: tuple[str, ...] = ()
    handoffs: tuple[str, ...] = ()
    #: A sub-agent's run: its parent run and the parent's step it answers, and its depth in the tree.
    parent_run_id: str | None = None
    parent_step_id: str | None = None
    depth: int = 0
    #: Children a run that ended asks to stop (its sub-agent calls still running when it ended).
    stop_children: tuple[str, ...] = ()
    #: The agent the run started with, once it handed the conversation over to another (``agent``).
    handed_from: str | None = None

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
        data["session_turns"] = list(self.session_turns)
        for name in ("subagents", "handoffs", "stop_children"):
            data[name] = list(getattr(self, name))
        data["messages"] = [message_to_dict(m) for m in self.messages]
        data["pending_request"] = request_to_dict(self.pending_request)
        if self.prefetch_served is not None:
            data["prefetch_served"] = self.prefetch_served.to_dict()
        data["sampling"] = self.sampling.to_dict()
        for name, default in _OMITTED_AT_DEFAULT.items():
            if data[name] == default:
                del data[name]
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
        data["session_turns"] = tuple(data.get("session_turns", ()))
        for name in ("subagents", "handoffs", "stop_children"):
            data[name] = tuple(data.get(name, ()))
        data["messages"] = tuple(message_from_dict(m) for m in data["messages"])
        data["pending_request"] = request_from_dict(data.get("pending_request"))
        served = data.get("prefetch_served")
        data["prefetch_served"] = PrefetchServed(**served) if served else None
        data["sampling"] = Sampling.from_dict(data.get("sampling"))
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
            agent=self.agent, parent_run_id=self.parent_run_id,
        )


_FIELDS = tuple(f.name for f in dataclasses.fields(RunState))
_FIELD_SET = frozenset(_FIELDS)
_TIMES = ("deadline", "expires_at", "submitted_at", "updated_at", "prefetch_sent_at", "prefetch_ready_at")
#: Fields a state got after states were first stored, left out of the JSON while they hold their default:
#: ``from_json`` fills the default in again, so nothing is lost, and a state that does not use them is
#: written as before (byte for byte: tests/unit/test_planner_state.py), and no larger.
_OMITTED_AT_DEFAULT: dict[str, Any] = {
    "sampling": Sampling().to_dict(), "output_schema": None, "output": None, "output_failures": 0,
    "output_retries": 2,
    "session": None, "session_epoch": 0, "session_seq": 0, "session_turns": [], "session_dropped": 0,
    "max_parallel_calls": 1, "tool_calling": "json", "native_tools": None, "agent": None, "collection": None,
    "subagents": [], "handoffs": [], "parent_run_id": None, "parent_step_id": None, "depth": 0, "stop_children": [],
    "handed_from": None,
}
