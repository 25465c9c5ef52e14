"""The closed sets of strings that agentstream's events, tables and reports carry, as types.

They are ``Literal`` types, not enums: the values are the very strings that travel in Avro
(``RunStateSnapshot.status``), in PostgreSQL (``runs.status``, ``steps.kind``) and in JSON, so nothing
on the wire changes, a value read back is already of its type, and code that compares with or passes a
string literal keeps working. The tuples beside them hold the same values for checks at run time.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias, TypeVar, get_args

T = TypeVar("T", bound=str)

#: A run's status (``runs.status``, ``RunStateSnapshot.status``): ``running`` while a step is pending,
#: ``awaiting_approval`` while a tool call waits for a person (no worker holds the run), ``queued`` while
#: a turn of a session waits for the session's previous turn to end, then one of the two terminal ones.
#: A cancelled run is ``failed`` with error code ``cancelled``.
RunStatus: TypeAlias = Literal["running", "awaiting_approval", "queued", "completed", "failed"]
#: How a run ended (``RunResult.status``; the terminal run statuses).
RunOutcome: TypeAlias = Literal["completed", "failed"]
RUN_STATUSES: Final[tuple[RunStatus, ...]] = get_args(RunStatus)
TERMINAL_STATUSES: Final[tuple[RunOutcome, ...]] = get_args(RunOutcome)

#: Why a run failed (``RunFailed.error_code``, ``runs.error_code``; docs/contract.md, "Reading the outcome"):
#: ``invalid_output`` is an answer that did not match the task's ``output_schema`` after the retries.
RunErrorCode: TypeAlias = Literal["invalid_task", "quota_exceeded", "cancelled", "deadline_exceeded", "max_duration",
                                  "max_steps", "model_error", "unparseable_model_output", "invalid_output",
                                  "tool_failed", "internal_error"]
RUN_ERROR_CODES: Final[tuple[RunErrorCode, ...]] = get_args(RunErrorCode)

#: What a run's pending step waits for (``RunStateSnapshot.pending_kind``): ``tools`` is several tool
#: calls of one model reply, running side by side (services/planner/fanout.py).
PendingKind: TypeAlias = Literal["model", "tool", "tools", "retrieval"]
#: A row of ``steps``: a pending step's kind, or ``prefetch`` (the retrieval started with the task).
StepKind: TypeAlias = Literal["model", "tool", "retrieval", "prefetch"]
#: A step's status (``steps.status``): ``requested`` until its result is recorded.
StepStatus: TypeAlias = Literal["requested", "completed", "failed"]
#: How a step ended (``StepResult.status``).
StepOutcome: TypeAlias = Literal["completed", "failed"]

#: What the planner does when a tool fails after its last retry (``TaskSubmitted.on_tool_error``).
OnToolError: TypeAlias = Literal["tell_model", "fail_run"]
ON_TOOL_ERROR: Final[tuple[OnToolError, ...]] = get_args(OnToolError)

#: Why a record could not become an event (``DecodeError.kind``; a dead letter's ``error_kind``).
DecodeErrorKind: TypeAlias = Literal["undecodable", "unknown_schema", "invalid"]
#: Why a record was dead-lettered (``DeadLetter.error_kind``, schemas/DeadLetter.avsc): by the runtime, or by
#: the tool service (``retries_exhausted``, and ``refused``: a call its run did not ask for, streams/store/tool_calls.py).
DeadLetterKind: TypeAlias = Literal["undecodable", "unknown_schema", "invalid", "handler_error", "retries_exhausted",
                                    "refused"]

#: Who speaks in a conversation (``Message.role``).
Role: TypeAlias = Literal["system", "user", "assistant", "tool"]
#: Why a tool call failed (``ToolCallCompleted.error_kind``, schemas/ToolCallCompleted.avsc).
ToolErrorKind: TypeAlias = Literal["unknown_tool", "invalid_arguments", "timeout", "tool_error",
                                   "retries_exhausted", "interrupted", "refused"]
#: What crossed a threshold, and how bad it is (``AlertRaised.kind`` / ``severity``).
AlertKind: TypeAlias = Literal["slow_tool", "slow_model_step", "tool_failure_rate", "consumer_lag"]
Severity: TypeAlias = Literal["warning", "critical"]

#: What a model's reply asks for (``streams/core/actions.py``).
ActionKind: TypeAlias = Literal["tool", "tools", "retrieve", "final_answer"]

#: Where spans go (``AGENTSTREAM_TRACING``).
TracingMode: TypeAlias = Literal["off", "file", "otlp"]
TRACING_MODES: Final[tuple[TracingMode, ...]] = get_args(TracingMode)
#: Whose word the planner takes for an approval (``Settings.approvals``).
ApprovalMode: TypeAlias = Literal["open", "recorded"]
APPROVAL_MODES: Final[tuple[ApprovalMode, ...]] = get_args(ApprovalMode)


def one_of(value: object, members: tuple[T, ...]) -> T | None:
    """The member of ``members`` equal to ``value`` (a string read from outside, typed as the set it
    belongs to), or None when it is not one of them."""
    for member in members:
        if member == value:
            return member
    return None


__all__ = ["APPROVAL_MODES", "ON_TOOL_ERROR", "RUN_ERROR_CODES", "RUN_STATUSES", "TERMINAL_STATUSES", "TRACING_MODES", "ActionKind", "AlertKind", "ApprovalMode",
           "DeadLetterKind", "DecodeErrorKind", "OnToolError", "PendingKind", "Role", "RunErrorCode", "RunOutcome", "RunStatus",
           "Severity", "StepKind", "StepOutcome", "StepStatus", "ToolErrorKind", "TracingMode", "one_of"]
