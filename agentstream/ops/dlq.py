"""The dead-letter topic for people: ``DeadLetters`` (list, show, re-drive), the backbone's
(``agentstream.streams.dlq``, shared with the gateway's ``/v1/dead-letters``), re-exported here for
``agentstream dlq list|show|redrive`` and the code that imported it from here."""

from __future__ import annotations

from agentstream.streams.dlq import (
    REDRIVE_HEADER,
    DeadLetters,
    LetterDetails,
    RedriveAction,
    RedriveResult,
    StoredLetter,
    ValueFrom,
    readable,
    redrivable_topics,
)

__all__ = ["REDRIVE_HEADER", "DeadLetters", "LetterDetails", "RedriveAction", "RedriveResult", "StoredLetter",
           "ValueFrom", "readable", "redrivable_topics"]
