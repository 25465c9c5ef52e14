"""What one pipeline (a tenant's cell) may use: ``Quotas``."""

from __future__ import annotations

from dataclasses import dataclass

from agentstream.streams.config import env


@dataclass(frozen=True, kw_only=True)
class Quotas:
    """What one pipeline (a tenant's cell) may use; None is no limit. Enforced by its planners: a task over
    a limit fails with ``quota_exceeded`` and the reason. ``runs_in_flight`` is counted in PostgreSQL when a
    task arrives, so planners taking tasks at the same moment can overshoot it by a few runs."""

    runs_in_flight: int | None = None
    max_steps: int | None = None
    tokens_per_run: int | None = None

    @classmethod
    def load(cls) -> Quotas:
        """``AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT``, ``AGENTSTREAM_QUOTA_MAX_STEPS``,
        ``AGENTSTREAM_QUOTA_TOKENS_PER_RUN`` (prompt + completion tokens of one run)."""
        return cls(runs_in_flight=env.optional_positive_int("AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT"),
                   max_steps=env.optional_positive_int("AGENTSTREAM_QUOTA_MAX_STEPS"),
                   tokens_per_run=env.optional_positive_int("AGENTSTREAM_QUOTA_TOKENS_PER_RUN"))
