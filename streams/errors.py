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
