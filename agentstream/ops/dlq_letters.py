"""What the operator sees of dead letters: the backbone's (``agentstream.streams.dlq.letters``), re-exported."""

from __future__ import annotations

from agentstream.streams.dlq.letters import (
    REDRIVE_HEADER,
    LetterDetails,
    RedriveAction,
    RedriveResult,
    StoredLetter,
    ValueFrom,
    readable,
)

__all__ = ["REDRIVE_HEADER", "LetterDetails", "RedriveAction", "RedriveResult", "StoredLetter", "ValueFrom",
           "readable"]
