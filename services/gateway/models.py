"""The gateway's request and response bodies (``/v1/runs``, approvals, sessions) as pydantic models: they
validate what comes in (422 with each field at fault), shape what goes out, and are the OpenAPI
document's schemas. The limits are the task rules' own (streams/core/task_rules.py) where a type can say
them; the rest (an unknown tool, a schema that is not JSON Schema) is refused by ``AgentClient.submit``
with the same reasons as for any client."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentstream.streams.core import task_rules


class RunRequest(BaseModel):
    """A task to run: what ``AgentClient.submit`` takes (README, "Using it"), as JSON."""

    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, description="What to do (at most 32 KiB).", examples=["What is 17 * 23?"])
    agent: str | None = Field(None, description="A registered agent (`name` or `name@version`, docs/agents.md) "
                                                "to run it: its definition then decides tools, model, prompt, "
                                                "settings and limits, and the task may set only its text, "
                                                "deadline, metadata and session. The gateway's own names "
                                                "(GET /v1/models; default `agentstream`) are the pipeline's "
                                                "default agent.")
    tools: list[str] | None = Field(None, description="The tools the run may call; default: every registered tool.")
    max_steps: int | None = Field(None, ge=1, le=task_rules.MAX_STEPS_LIMIT,
                                  description="The run's step budget (default: the agent's, else 8).")
    deadline: float | datetime | None = Field(None, description="Seconds from now, or an RFC 3339 time.")
    output_schema: dict[str, Any] | None = Field(None, description="A JSON Schema the answer must match; the "
                                                                   "run's `output` is then the parsed answer.")
    session: str | None = Field(None, max_length=task_rules.MAX_SESSION_ID_CHARS,
                                description="Make the task a turn of this conversation (a new one if new).")
    system_prompt: str | None = None
    metadata: dict[str, str] | None = None
    prefetch: bool = Field(True, description="Retrieve for the task alongside the first model call.")
    on_tool_error: Literal["tell_model", "fail_run"] = "tell_model"
    model: str | None = Field(None, description="The model the inference service should use, if it serves several.")
    max_tokens: int | None = Field(None, ge=1, le=task_rules.MAX_TOKENS_CEILING)
    temperature: float | None = Field(None, ge=0, le=task_rules.MAX_TEMPERATURE)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: list[str] | None = Field(None, max_length=task_rules.MAX_STOP_STRINGS)
    seed: int | None = Field(None, ge=0, le=task_rules.MAX_SEED)
    tool_calling: Literal["json", "native"] | None = None


class Links(BaseModel):
    self: str
    events: str


class RunAccepted(BaseModel):
    """A task the pipeline has accepted: its run id (the same for a retry with the same Idempotency-Key)."""

    run_id: str
    status: Literal["submitted"] = "submitted"
    session: str | None = None
    links: Links


class StepView(BaseModel):
    index: int
    kind: str
    status: str
    request: dict[str, Any]
    result: dict[str, Any] | None = None
    error: str | None = None
    requested_at: datetime
    completed_at: datetime | None = None


class RunView(BaseModel):
    """A run as PostgreSQL records it: its status, answer (``output``: parsed, for a task with an output
    schema), error, and its steps so far."""

    run_id: str
    status: str
    task: str
    answer: str | None = None
    output: Any = None
    error_code: str | None = None
    error: str | None = None
    step_count: int
    session: str | None = None
    submitted_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None
    steps: list[StepView]


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=1000)


class Cancelled(BaseModel):
    run_id: str
    status: Literal["cancelling", "ended"]


class Approval(BaseModel):
    """A tool call waiting for a person."""

    run_id: str
    step_id: str
    tool: str | None = None
    arguments: Any = None
    since: datetime


class Approvals(BaseModel):
    approvals: list[Approval]


class DecisionRequest(BaseModel):
    """Why (optional). Who decides is the token's, never the body's: any other field is refused."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field("", max_length=1000)


class DecisionView(BaseModel):
    """The decision that holds for the step: the first decision on a step stands, so it may not be the one
    this request asked for (``as_asked`` false, ``earlier`` true)."""

    run_id: str
    step_id: str
    approved: bool
    as_asked: bool
    reason: str
    decided_by: str
    decided_at: datetime | None = None
    recorded: bool
    earlier: bool


class SessionSummary(BaseModel):
    session_id: str
    turns: int
    dropped: int
    tokens: int
    last_run_id: str | None = None
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None = None


class Sessions(BaseModel):
    sessions: list[SessionSummary]


class TurnView(BaseModel):
    run_id: str
    status: str
    seq: int


class SessionView(SessionSummary):
    """A session's transcript (oldest turn first; ``summary``: what was folded out of it) and its turns
    still going, in order."""

    summary: str = ""
    transcript: list[dict[str, Any]]
    going: list[TurnView]


class SessionDeleted(BaseModel):
    session_id: str
    stopping: list[str] = Field(description="The runs of the session's turns that were asked to stop.")


__all__ = ["Approval", "Approvals", "CancelRequest", "Cancelled", "DecisionRequest", "DecisionView", "Links",
           "RunAccepted", "RunRequest", "RunView", "SessionDeleted", "SessionSummary", "SessionView", "Sessions",
           "StepView", "TurnView"]
