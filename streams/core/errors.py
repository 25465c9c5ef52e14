"""Every error agentstream raises on purpose, in one tree under ``AgentStreamError``.

One module, so that a user finds every error they may catch in one place, and one root, so that
``except AgentStreamError`` catches them all. Retryability is a property of the error class
(``retriable``), not a guess made by the caller: the consumer runtime retries what says it may be
retried and dead-letters the rest. What a handler raises to steer the runtime (a record put aside, a
partition lost) is not an error and is not here: ``streams/core/signals.py``.
"""

from __future__ import annotations

from agentstream.streams.core.kinds import DecodeErrorKind


class AgentStreamError(Exception):
    """Root of all agentstream errors."""

    retriable: bool = False


# --- Settings and the stack ---

class ConfigError(AgentStreamError):
    """A setting is missing or malformed; the message says which and how to set it."""


class StackError(AgentStreamError):
    """The local development stack (Kafka, PostgreSQL) could not be started, reached or stopped."""


class MigrationError(AgentStreamError):
    """A database migration failed or an applied migration was edited after it ran."""


class MissingExtra(AgentStreamError, ImportError):
    """A part of agentstream needs an optional dependency that is not installed."""

    def __init__(self, extra: str, module: str, wanted: str | None = None) -> None:
        self.extra = extra
        self.module = module
        what = f"{wanted} needs" if wanted else "this needs"
        super().__init__(f"{what} the '{extra}' extra (module {module!r} is not installed): "
                         f"pip install 'agentstream[{extra}]'")


# --- Dependencies ---

class Unavailable(AgentStreamError):
    """A dependency (PostgreSQL, the broker) cannot be reached right now; trying again later may work.
    Client calls raise it instead of the driver's own exception."""

    retriable = True


# --- Events on the wire: decoding, schemas, size, topics ---

class DecodeError(AgentStreamError):
    """A record is not an event this process can use. ``kind`` says why: ``undecodable`` (not the wire
    format, or not Avro), ``unknown_schema`` (a schema id no one published: ``unknown_id``) or
    ``invalid`` (decoded, but its fields break the event's rules); ``reason`` says what exactly.
    A service dead-letters such a record instead of stopping on it."""

    def __init__(self, kind: DecodeErrorKind, reason: str, *, unknown_id: int | None = None) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind: DecodeErrorKind = kind
        self.reason = reason
        #: The schema id no registry knew (``unknown_schema`` for that reason only).
        self.unknown_id = unknown_id


class UnknownSchema(AgentStreamError):
    """No schema is known for an id, or for a record name."""


class EventTooLarge(AgentStreamError):
    """An event larger than a record may be, where no claim-check store is available (a client)."""


class ClaimMissing(AgentStreamError):
    """A claim check whose body is not in ``event_payloads`` (pruned, or another database)."""


class TopicMismatch(AgentStreamError):
    """An existing topic has a partition count that cannot be brought in line with its specification."""


class TopicsMissing(AgentStreamError):
    """Topics a client needs do not exist yet: no worker has created them."""


class DeadLetterError(AgentStreamError):
    """A dead letter, or the record it stands for, cannot be found or used; the message says why."""


# --- Submitting and deciding (the client) ---

class TaskRejected(AgentStreamError):
    """The task was refused before anything was published; the message says why."""


class NotAnApprover(AgentStreamError):
    """A decision on a tool call from a login that may not make one (``approvals = recorded``)."""


class NotAwaitingApproval(AgentStreamError):
    """A decision on a step the run does not wait at (not reached, over, or no such run), with no decision
    recorded on it yet: ``agentstream_decide`` refuses it and records nothing (``approvals = recorded``)."""


# --- The agent's work: model replies, tools, models, retrieval ---

class ActionError(AgentStreamError, ValueError):
    """The reply is not a usable action; the message is shown to the model."""


class ToolCatalogUnavailable(AgentStreamError):
    """The tool catalogue could not be read in time: the broker did not answer, or no worker has created
    the topic yet. Retriable: it says nothing about the task, only about the broker."""

    retriable = True
    #: Kafka's outage (``outages.outage_of``): a worker starting, or a planner handling a task, waits it out.
    dependency: str | None = None


class AgentRejected(AgentStreamError):
    """An agent definition is not valid, or the agent catalogue refused its registration (an unknown tool
    or agent it names, a cycle of calls, a changed definition under a registered version, a lower
    version); the message says why and names what exists (streams/core/agents.py,
    streams/catalog/agents.py)."""


class AgentCatalogUnavailable(AgentStreamError):
    """The agent catalogue (``agent.agents``) could not be read in time. Retriable, as
    ``ToolCatalogUnavailable``: it says nothing about the task or the definition, only about the broker."""

    retriable = True
    #: Kafka's outage (``outages.outage_of``): a planner handling a task waits it out.
    dependency: str | None = None


class ToolArgumentError(AgentStreamError):
    """The arguments do not match the tool's schema."""


class ToolError(AgentStreamError):
    """A tool failed; ``retriable`` when trying again may succeed."""

    def __init__(self, message: str, *, retriable: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable


class BackendError(AgentStreamError):
    """The engine failed a request. ``retriable`` when trying again may succeed (overload, 5xx, I/O):
    then the model server is having an outage (``dependency``), which the runtime waits out
    (streams/core/outages.py) instead of dead-lettering the request. ``fatal`` when the engine itself is gone
    (an in-process engine that shut down after an internal error): no request can succeed in this
    process any more, so the service stops and the worker exits for its supervisor to restart it,
    leaving the request to the partition's next owner (services/inference/service.py)."""

    def __init__(self, message: str, *, retriable: bool = False, fatal: bool = False) -> None:
        super().__init__(message)
        self.retriable = retriable and not fatal
        self.fatal = fatal
        self.dependency = "model" if self.retriable else None


class EmbeddingModelUnavailable(AgentStreamError, RuntimeError):
    """The model or tokenizer file is missing or is not the pinned one (says which, and how to fix it).
    An AgentStreamError, so the CLI prints it as one line."""


class IngestError(AgentStreamError):
    """A path to ingest does not exist (the CLI prints this as one line)."""


# --- The run history ---

class VersionConflict(AgentStreamError):
    """Another writer moved the run on; reload its state and try again."""

    retriable = True


class TransitionRejected(AgentStreamError):
    """PostgreSQL refused this transition's data (the other transitions of its batch were written)."""


# --- Operator tools ---

class ReplayError(AgentStreamError):
    """The run to replay does not exist, or the replay could not run; the message says why."""


class PodmanError(AgentStreamError):
    """A podman command failed."""
