"""How conversations (sessions) keep their transcript in bounds: ``SessionSettings``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, get_args

from agentstream.streams.config import env
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.kinds import one_of

#: What happens to a session's oldest turns when its transcript is over the budget.
SessionOverflow: TypeAlias = Literal["drop", "summarise"]
SESSION_OVERFLOWS: Final[tuple[SessionOverflow, ...]] = get_args(SessionOverflow)
#: Estimated tokens of transcript a turn may start from: with the instructions, the tools and the task,
#: it leaves room for the turn's own steps in the CPU model's 2,048-token context.
DEFAULT_TOKEN_BUDGET: Final = 1024


@dataclass(frozen=True, kw_only=True)
class SessionSettings:
    """``token_budget``: the estimated tokens (services/planner/transcript.py) of earlier turns a turn's
    model may see; the oldest turns beyond it are dropped (``overflow = drop``) or condensed into the
    session's summary by a model step of the turn (``summarise``: services/planner/summaries.py) before
    the turn starts, so no model request carries a transcript over it."""

    token_budget: int = DEFAULT_TOKEN_BUDGET
    overflow: SessionOverflow = "drop"

    @classmethod
    def load(cls) -> SessionSettings:
        """``AGENTSTREAM_SESSION_TOKEN_BUDGET`` (default 1024), ``AGENTSTREAM_SESSION_OVERFLOW`` (drop)."""
        raw = os.environ.get("AGENTSTREAM_SESSION_OVERFLOW", "").strip().lower() or "drop"
        overflow = one_of(raw, SESSION_OVERFLOWS)
        if overflow is None:
            raise ConfigError(f"AGENTSTREAM_SESSION_OVERFLOW={raw!r} must be one of {', '.join(SESSION_OVERFLOWS)}")
        return cls(token_budget=env.positive_int("AGENTSTREAM_SESSION_TOKEN_BUDGET", DEFAULT_TOKEN_BUDGET),
                   overflow=overflow)
