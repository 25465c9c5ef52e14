"""One root for every error agentstream raises on purpose.

Retryability is a property of the error class (``retriable``), not a guess made by the caller:
the consumer runtime retries what says it may be retried and dead-letters the rest.
"""

from __future__ import annotations

import asyncio


class AgentStreamError(Exception):
    """Root of all agentstream errors."""

    retriable: bool = False


class ConfigError(AgentStreamError):
    """A setting is missing or malformed; the message says which and how to set it."""


class StackError(AgentStreamError):
    """The local development stack (Kafka, PostgreSQL) could not be started, reached or stopped."""


class MigrationError(AgentStreamError):
    """A database migration failed or an applied migration was edited after it ran."""


class Abandoned(AgentStreamError):
    """This process must not finish the record it is handling: it no longer owns the record's partition
    (another member took it over after a pause or a network cut). The runtime leaves the record
    uncommitted and unacknowledged; the partition's new owner handles it."""


class Deferred(AgentStreamError):
    """A handler cannot handle this record yet: what it answers is still to be redone from another
    record (the planner: a result for a step whose request was published while the transition that
    asked for it was being recorded, when that planner died before the record was). The runtime puts it
    aside — not done, so its offset is not committed past — lets the key's next records through, and
    hands it over again once ``ready`` resolves or ``timeout_s`` passed (``Record.deferrals`` counts)."""

    def __init__(self, reason: str, *, ready: asyncio.Future[None] | None = None, timeout_s: float = 30.0) -> None:
        super().__init__(reason)
        self.ready = ready
        self.timeout_s = timeout_s


class Unavailable(AgentStreamError):
    """A dependency (PostgreSQL, the broker) cannot be reached right now; trying again later may work.
    Client calls raise it instead of the driver's own exception."""

    retriable = True
