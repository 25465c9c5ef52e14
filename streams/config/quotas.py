"""What one pipeline (a tenant's cell) may use: ``Quotas``."""

from __future__ import annotations

from dataclasses import dataclass

from agentstream.streams.config import env


@dataclass(frozen=True, kw_only=True)
class Quotas:
    """What one pipeline (a tenant's cell) may use; None is no limit. Enforced by its planners: a task over
    a limit fails with ``quota_exceeded`` and the reason. ``runs_in_flight`` is counted in PostgreSQL when a
    task arrives, so planners taking tasks at the same moment can overshoot it by a few runs.

    Budgets over time (fixed UTC windows, counted in PostgreSQL and shared by the cell's planners:
    streams/store/budgets.py): ``tokens_per_hour`` and ``tokens_per_day`` (prompt + completion tokens of all
    the cell's runs, charged as each model step's result arrives: the run whose step uses the last of one
    fails, and so do tasks that arrive while it is used up), ``tasks_per_second`` (tasks admitted; the one
    past it fails)."""

    runs_in_flight: int | None = None
    max_steps: int | None = None
    tokens_per_run: int | None = None
    tokens_per_hour: int | None = None
    tokens_per_day: int | None = None
    tasks_per_second: int | None = None

    @property
    def token_budgets(self) -> bool:
        """Whether a model step's tokens are charged (one round trip to PostgreSQL per model step)."""
        return self.tokens_per_hour is not None or self.tokens_per_day is not None

    @classmethod
    def load(cls) -> Quotas:
        """``AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT``, ``AGENTSTREAM_QUOTA_MAX_STEPS``,
        ``AGENTSTREAM_QUOTA_TOKENS_PER_RUN`` (prompt + completion tokens of one run),
        ``AGENTSTREAM_QUOTA_TOKENS_PER_HOUR``, ``AGENTSTREAM_QUOTA_TOKENS_PER_DAY`` (of the whole cell),
        ``AGENTSTREAM_QUOTA_TASKS_PER_SECOND``."""
        return cls(runs_in_flight=env.optional_positive_int("AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT"),
                   max_steps=env.optional_positive_int("AGENTSTREAM_QUOTA_MAX_STEPS"),
                   tokens_per_run=env.optional_positive_int("AGENTSTREAM_QUOTA_TOKENS_PER_RUN"),
                   tokens_per_hour=env.optional_positive_int("AGENTSTREAM_QUOTA_TOKENS_PER_HOUR"),
                   tokens_per_day=env.optional_positive_int("AGENTSTREAM_QUOTA_TOKENS_PER_DAY"),
                   tasks_per_second=env.optional_positive_int("AGENTSTREAM_QUOTA_TASKS_PER_SECOND"))
