"""One root for every error agentstream raises on purpose.

Retryability is a property of the error class (``retriable``), not a guess made by the caller:
the consumer runtime retries what says it may be retried and dead-letters the rest.
"""

from __future__ import annotations


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


class Unavailable(AgentStreamError):
    """A dependency (PostgreSQL, the broker) cannot be reached right now; trying again later may work.
    Client calls raise it instead of the driver's own exception."""

    retriable = True
