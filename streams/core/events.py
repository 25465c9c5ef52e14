"""Event types, mirroring ``schemas/*.avsc`` field for field (a contract test keeps them in step).

Every event shares the envelope fields of ``Event``. Ids are deterministic so that a transition
replayed after a crash republishes the same events, and consumers can drop the copies:

- ``event_id`` → a UUIDv5 of the step id, the event type and the attempt (``event_id_for``); events
  from other producers may carry any non-empty id (``task_rules.event_id_problem``);
- ``step_id``, by event (docs/contract.md, "Ids"): a model, tool or retrieval step (its request, its
  result, its token chunks, an ``ApprovalDecided``) is ``step_id(run_id, index, kind)`` →
  ``"{run_id}:{index}:{kind}"`` (index from 0, kind ``model``, ``tool`` or ``retrieval``); a
  ``TaskSubmitted`` is ``"{run_id}:task"``, a ``RunCancelRequested`` ``"{run_id}:cancel"``, the
  speculative retrieval ``"{run_id}:prefetch"``, a tool's own retrieval ``"{tool step}/retrieve"``,
  ``RunCompleted``/``RunFailed`` ``"{run_id}:outcome"``, a ``RunStateSnapshot``
  ``"{run_id}:snapshot:{version}"``, a ``DeadLetter`` ``"dlq:{topic}:{partition}:{offset}"`` (or
  ``"dlq:{step}"`` from the tool service), a ``ToolRegistered`` ``"tools:{name}"``, an ``AgentRegistered``
  ``"agents:{name}@{version}"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Self

from agentstream.streams.core.datums import from_dict, to_dict
from agentstream.streams.core.ids import MAX_STEP_ID_CHARS, default_instance, event_id_for, utcnow
from agentstream.streams.core.kinds import (
    AlertKind,
    DeadLetterKind,
    OnToolError,
    PendingKind,
    Role,
    RunStatus,
    Severity,
    ToolErrorKind,
)
from agentstream.streams.core.task_rules import event_id_problem, run_id_problem


@dataclass(frozen=True, kw_only=True)
class Producer:
    service: str
    instance: str = field(default_factory=default_instance)


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call an assistant message made with the engine's native tool calling: the id the model
    (or its server) gave it, the tool's name and its arguments (a JSON object, as text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class Message:
    """One message of a conversation, as a model request carries it (``InferenceRequested.messages``).

    ``role`` is ``system``, ``user``, ``assistant`` or ``tool``; ``name`` is the tool's, on the message
    that hands a tool's result (or its refusal) back to the model. Native tool calling (``tool_calling =
    native``) adds structure: an assistant message's ``tool_calls``, and on a tool message the id of the
    call it answers (``tool_call_id``).
    """

    role: Role
    content: str
    name: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Passage:
    id: str
    text: str
    score: float
    source: str | None = None


@dataclass(frozen=True, kw_only=True)
class Event:
    """The envelope every event carries. ``schema_name`` is the Avro record's full name."""

    schema_name: ClassVar[str] = ""

    event_id: str
    run_id: str
    step_id: str
    parent_step_id: str | None = None
    attempt: int = 0
    created_at: datetime
    producer: Producer

    @classmethod
    def build(cls, *, run_id: str, step: str, service: str, attempt: int = 0,
              parent_step_id: str | None = None, created_at: datetime | None = None, part: str = "",
              **payload: Any) -> Self:
        """An event of this type with its deterministic ``event_id`` filled in. ``part`` tells apart
        several events of one type for one step (the token chunks of a generation)."""
        return cls(
            event_id=event_id_for(f"{step}#{part}" if part else step, cls.__name__, attempt),
            run_id=run_id, step_id=step,
            parent_step_id=parent_step_id, attempt=attempt, created_at=created_at or utcnow(),
            producer=Producer(service=service), **payload,
        )

    def problem(self) -> str | None:
        """What makes this event unusable, or None. Services check their own payload rules."""
        id_problem = event_id_problem(self.event_id)
        if id_problem:
            return id_problem
        run_problem = run_id_problem(self.run_id)
        if run_problem:  # every event is keyed, stored and logged by its run id: bounded everywhere
            return run_problem
        if not self.step_id:
            return "step_id is empty"
        if len(self.step_id) > MAX_STEP_ID_CHARS:
            return f"the step id is {len(self.step_id)} characters; the limit is {MAX_STEP_ID_CHARS}"
        if self.attempt < 0:
            return "attempt is negative"
        return None

    def to_dict(self) -> dict[str, Any]:
        """The Avro datum (nested records as dicts)."""
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        event: Self = from_dict(cls, data)
        return event


_NS = "io.agentstream.events."


@dataclass(frozen=True, kw_only=True)
class TaskSubmitted(Event):
    """A task for the agent: the event that starts a run, on ``agent.tasks``.

    ``AgentClient.submit`` builds and sends it; any producer may (docs/contract.md). The run may call
    ``tools`` and take at most ``max_steps`` steps before ``deadline``; ``model`` and ``system_prompt``
    override the service's; ``prefetch`` starts a retrieval of the task's subject alongside the first
    model call; ``on_tool_error`` says whether a failed tool call is told to the model or fails the run;
    ``replay_of`` names the run that a replay reruns; ``output_schema`` asks for an answer of that JSON
    Schema (``RunCompleted.output``); ``max_tokens``, ``temperature``, ``top_p``, ``stop`` and ``seed`` tune
    each model step. The planner checks it before starting the run.
    """

    schema_name: ClassVar[str] = _NS + "TaskSubmitted"
    task: str
    tools: list[str] = field(default_factory=list)
    max_steps: int
    deadline: datetime | None = None
    model: str | None = None
    system_prompt: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    prefetch: bool = True
    on_tool_error: OnToolError = "tell_model"
    replay_of: str | None = None
    #: A JSON Schema (JSON text) the answer must match (streams/core/structured.py); None: a text answer.
    output_schema: str | None = None
    #: Generation settings for every model step of the run; None (``[]``): the planner's defaults
    #: (streams/config/generation.py: 256 tokens, temperature 0; top_p and seed the engine's).
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    #: The conversation this task is a turn of (None: a run on its own). The turn starts from the session's
    #: transcript and runs after its earlier turns; its run id must be on the session's partition
    #: (``Topics.run_id_for_session``; docs/contract.md, "Sessions").
    session: str | None = None
    #: How the model calls tools: ``native`` (the engine's tool calling) or ``json`` (one JSON action per
    #: reply); None: the planner's default (``AGENTSTREAM_TOOL_CALLING``, ``json``).
    tool_calling: str | None = None
    #: The registered agent the task runs: ``name`` (its latest version) or ``name@version``; the run takes
    #: its tools, prompt, limits and settings from the definition (streams/core/agents.py: the task adds its
    #: text, deadline, metadata and session). None: the task's own fields.
    agent: str | None = None
    #: A sub-agent's run: the run whose model called it (the envelope's ``parent_step_id`` is that run's
    #: step, whose result this run's outcome becomes: services/planner/subagents.py), and its depth.
    parent_run_id: str | None = None
    depth: int = 0


@dataclass(frozen=True, kw_only=True)
class InferenceRequested(Event):
    schema_name: ClassVar[str] = _NS + "InferenceRequested"
    messages: list[Message]
    model: str | None = None
    response_schema: str | None = None
    max_tokens: int = 256
    temperature: float = 0.0
    deadline: datetime | None = None
    #: Sampling settings from the run's task; None (``[]``): the engine's own.
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    #: Native tool calling: the run's tools as OpenAI function tools (a JSON array, as text); None in the
    #: JSON-action mode (the tools are described in the system message and the action schema).
    tools: str | None = None
    #: The session the run is a turn of: the engine's cache key, so a session's turns reuse its KV prefix.
    session: str | None = None


@dataclass(frozen=True, kw_only=True)
class InferenceCompleted(Event):
    schema_name: ClassVar[str] = _NS + "InferenceCompleted"
    text: str
    finish_reason: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0
    ttft_ms: float = 0.0
    duration_ms: float = 0.0
    model: str = ""
    backend: str = ""
    error: str | None = None
    #: Native tool calling: the calls the model made (its ``text`` may then be empty).
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class TokenChunk(Event):
    """A piece of text a model generated, on ``agent.tokens`` while it generates, so that a client can
    show an answer as it is written (``AgentClient.stream``). ``seq`` orders the chunks of one step.
    """

    schema_name: ClassVar[str] = _NS + "TokenChunk"
    seq: int
    text: str


@dataclass(frozen=True, kw_only=True)
class RetrievalRequested(Event):
    schema_name: ClassVar[str] = _NS + "RetrievalRequested"
    query: str
    k: int = 5
    collection: str = "default"


@dataclass(frozen=True, kw_only=True)
class RetrievalCompleted(Event):
    schema_name: ClassVar[str] = _NS + "RetrievalCompleted"
    passages: list[Passage] = field(default_factory=list)
    error: str | None = None
    duration_ms: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ToolCallRequested(Event):
    schema_name: ClassVar[str] = _NS + "ToolCallRequested"
    tool: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class ToolCallCompleted(Event):
    schema_name: ClassVar[str] = _NS + "ToolCallCompleted"
    tool: str
    ok: bool
    result: str | None = None
    error: str | None = None
    duration_ms: float = 0.0
    replayed: bool = False
    error_kind: ToolErrorKind | None = None
    attempts: int = 1


@dataclass(frozen=True, kw_only=True)
class RunStateSnapshot(Event):
    schema_name: ClassVar[str] = _NS + "RunStateSnapshot"
    status: RunStatus
    task: str
    tools: list[str] = field(default_factory=list)
    max_steps: int
    deadline: datetime | None = None
    model: str | None = None
    system_prompt: str | None = None
    step_index: int
    pending_step_id: str | None = None
    pending_kind: PendingKind | None = None
    messages: list[Message] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None
    error_code: str | None = None
    parse_failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    version: int
    submitted_at: datetime
    updated_at: datetime
    traceparent: str | None = None
    #: The exact agent definition the run uses (``name@version``), when its task named one.
    agent: str | None = None
    #: The run this one is a sub-agent of (None: none).
    parent_run_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunCancelRequested(Event):
    schema_name: ClassVar[str] = _NS + "RunCancelRequested"
    reason: str = ""
    requested_by: str = ""


@dataclass(frozen=True, kw_only=True)
class ApprovalDecided(Event):
    schema_name: ClassVar[str] = _NS + "ApprovalDecided"
    approved: bool
    reason: str = ""
    decided_by: str = ""


@dataclass(frozen=True, kw_only=True)
class RunCompleted(Event):
    """A run's success, on ``agent.outcomes``: the ``answer``, the steps it took, its duration and the
    tokens its model steps used. Exactly one outcome is published per run; ``AgentClient.wait`` returns
    it as a ``RunResult``.
    """

    schema_name: ClassVar[str] = _NS + "RunCompleted"
    answer: str
    steps: int
    duration_ms: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: For a task with an ``output_schema``: the answer as JSON text that matches it (``answer`` holds the
    #: same text); None otherwise.
    output: str | None = None


@dataclass(frozen=True, kw_only=True)
class RunFailed(Event):
    """A run's failure, on ``agent.outcomes``: an ``error_code`` a program can act on (``cancelled``,
    ``deadline_exceeded``, ``max_steps``, ...) and an ``error`` a person can read. Exactly one outcome is
    published per run; ``AgentClient.wait`` returns it as a ``RunResult``.
    """

    schema_name: ClassVar[str] = _NS + "RunFailed"
    error_code: str
    error: str
    steps: int
    duration_ms: float


@dataclass(frozen=True, kw_only=True)
class DeadLetter(Event):
    schema_name: ClassVar[str] = _NS + "DeadLetter"
    consumer: str
    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None = None
    value: bytes | None = None
    headers: dict[str, bytes] = field(default_factory=dict)
    error_kind: DeadLetterKind
    reason: str
    #: The original value's size and SHA-256 (hex): a truncated letter still identifies its original, and
    #: a re-drive checks that what it read back from the source topic is that record. None in old letters.
    value_size: int | None = None
    value_sha256: str | None = None
    #: Cut to fit ``Settings.max_event_bytes`` (streams/runtime/dead_letters.py): ``value`` is a prefix; key, header values
    #: and reason may be cut too.
    truncated: bool = False

    def problem(self) -> str | None:
        """A dead letter may not know its run (the record it carries may not have decoded)."""
        return None if self.step_id else "step_id is empty"


@dataclass(frozen=True, kw_only=True)
class ClaimCheck(Event):
    """Stands in for an event whose encoding is larger than a Kafka record may be (streams/kafka/claims.py).
    It keeps the event's id, run and step, so consumers route and de-duplicate it as the event itself."""

    schema_name: ClassVar[str] = _NS + "ClaimCheck"
    event_type: str
    digest: str
    size: int


@dataclass(frozen=True, kw_only=True)
class AlertRaised(Event):
    """A threshold crossed (``agent.alerts``, raised by services/alerts). ``run_id``/``step_id`` name the
    step that crossed it when there is one (a slow tool call); aggregate alerts have an empty run id."""

    schema_name: ClassVar[str] = _NS + "AlertRaised"
    kind: AlertKind
    severity: Severity = "warning"
    subject: str
    value: float
    threshold: float
    unit: str
    count: int = 0
    window_start: datetime | None = None
    window_end: datetime | None = None
    message: str

    def problem(self) -> str | None:
        return None if self.step_id else "step_id is empty"


@dataclass(frozen=True, kw_only=True)
class ToolRegistered(Event):
    """A tool worker serves this tool (compacted ``agent.tools``, so submit can check tool names without
    PostgreSQL; key: name, version and metadata digest, so compaction keeps every distinct registration
    and readers can always pick each tool's highest version). It belongs to no run: ``run_id`` is
    ``"tools"`` and ``step_id`` is ``tools:{name}`` (streams/catalog/tools.py)."""

    schema_name: ClassVar[str] = _NS + "ToolRegistered"
    name: str
    description: str
    parameters: str  # the arguments' JSON schema, as JSON text (its shape is the tool's own business)
    requires_approval: bool = False
    registered_by: str
    #: The metadata's version (``@tool(version=N)``); 0: registered before versions existed.
    version: int = 0

    def problem(self) -> str | None:
        return super().problem() or (None if self.name else "name is empty")


@dataclass(frozen=True, kw_only=True)
class AgentRegistered(Event):
    """An agent definition registered on the compacted ``agent.agents`` (key: name, version and digest, so
    compaction keeps every distinct registration and readers keep every version). It belongs to no run:
    ``run_id`` is ``"agents"`` and ``step_id`` ``agents:{name}@{version}`` (streams/catalog/agents.py).
    ``definition`` is the definition's JSON (streams/core/agents.py), ``digest`` its SHA-256 (16 hex digits)."""

    schema_name: ClassVar[str] = _NS + "AgentRegistered"
    name: str
    version: int
    description: str = ""
    definition: str
    digest: str
    registered_by: str = ""

    def problem(self) -> str | None:
        return super().problem() or (None if self.name else "name is empty")


@dataclass(frozen=True, kw_only=True)
class SessionTurn:
    """One finished turn of a session, as ``SessionUpdated`` carries it: its run, the user's message, the
    model's final reply (what the next turn's model sees), the answer and its estimated tokens."""

    run_id: str
    user: str
    reply: str
    answer: str
    tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class SessionUpdated(Event):
    """A session's transcript after one of its turns finished, on the compacted ``agent.sessions`` keyed
    by the session id (a deleted session gets a tombstone). The envelope's run is the turn that finished;
    the step id is ``{run_id}:session``. PostgreSQL's ``sessions`` row is the transcript of record."""

    schema_name: ClassVar[str] = _NS + "SessionUpdated"
    session: str
    epoch: int = 0
    turns: list[SessionTurn] = field(default_factory=list)
    dropped: int = 0
    tokens: int = 0
    #: The turns folded out of ``turns`` as a model summarised them (``overflow = summarise``); "" if none.
    summary: str = ""


#: Every event class by its Avro record name (``Event.schema_name``): the events agentstream puts on its
#: topics, and the only records a codec decodes (any other name is an ``unknown_schema`` ``DecodeError``).
EVENT_TYPES: dict[str, type[Event]] = {
    cls.schema_name: cls
    for cls in (TaskSubmitted, InferenceRequested, InferenceCompleted, TokenChunk, RetrievalRequested,
                RetrievalCompleted, ToolCallRequested, ToolCallCompleted, RunStateSnapshot, RunCancelRequested,
                ApprovalDecided, RunCompleted, RunFailed, DeadLetter, AlertRaised, ClaimCheck, ToolRegistered,
                SessionUpdated, AgentRegistered)
}
