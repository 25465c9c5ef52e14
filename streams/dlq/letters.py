"""What the operator sees of dead letters: a letter where it is stored, what ``show`` tells about it,
and what a re-drive did with it (``agentstream.streams.dlq``: ``agentstream dlq`` and the gateway's
``/v1/dead-letters``).

Plain data: JSON-ready views for the command line and the gateway, and the header a re-driven copy carries.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias

from agentstream.streams.core.events import DeadLetter, Event

#: On a re-driven copy: ``"{dlq topic}:{partition}:{offset}"`` of the letter it came from.
REDRIVE_HEADER = "agentstream-redrive"

#: What a re-drive did with a letter (``RedriveResult.action``).
RedriveAction: TypeAlias = Literal["redriven", "would_redrive", "skipped", "refused", "failed"]
#: Where a re-driven record came from: the letter itself, or (truncated letters) the source topic
#: (``dlq_redrives.value_from``, migration 0009).
ValueFrom: TypeAlias = Literal["letter", "source"]


@dataclass(frozen=True)
class StoredLetter:
    """One record of the dead-letter topic: where it is, and the letter (None when it does not decode,
    ``problem`` says why). ``redrives``: how often it was re-driven (None when not looked up)."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime
    letter: DeadLetter | None
    problem: str | None = None
    redrives: int | None = None

    @property
    def address(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    def summary(self) -> dict[str, Any]:
        """What ``list`` shows, as JSON-ready values (the reason whole)."""
        out: dict[str, Any] = {"offset": self.offset, "partition": self.partition,
                               "time": self.timestamp.isoformat(), "redrives": self.redrives}
        letter = self.letter
        if letter is None:
            return {**out, "problem": self.problem}
        redrive_of = letter.headers.get(REDRIVE_HEADER)
        return {**out, "source_topic": letter.source_topic, "source_partition": letter.source_partition,
                "source_offset": letter.source_offset, "consumer": letter.consumer,
                "error_kind": letter.error_kind, "reason": letter.reason, "run_id": letter.run_id,
                "truncated": letter.truncated, "value_size": letter.value_size,
                "redrive_of": None if redrive_of is None else redrive_of.decode(errors="replace")}


@dataclass(frozen=True)
class LetterDetails:
    """What ``show`` tells about one letter: the stored letter, the original event when its value is
    whole and decodes (else why not), and the re-drives recorded so far."""

    stored: StoredLetter
    original: Event | None
    original_problem: str | None
    redrives: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        letter = self.stored.letter
        out = self.stored.summary()
        if letter is not None:
            out.update({
                "event_id": letter.event_id, "step_id": letter.step_id, "parent_step_id": letter.parent_step_id,
                "created_at": letter.created_at.isoformat(), "producer": letter.producer.service,
                "instance": letter.producer.instance, "key": readable(letter.key),
                "headers": {k: readable(v) for k, v in letter.headers.items()},
                "value_preview": readable(None if letter.value is None else letter.value[:160]),
                "value_base64": None if letter.value is None else base64.b64encode(letter.value).decode(),
                "value_kept": None if letter.value is None else len(letter.value),
                "value_sha256": letter.value_sha256})
        out.update({
            "original_type": None if self.original is None else type(self.original).__name__,
            "original": None if self.original is None else self.original.to_dict(),
            "original_problem": self.original_problem, "redrive_history": self.redrives})
        return out


@dataclass(frozen=True)
class RedriveResult:
    """What happened to one letter: ``redriven``, ``would_redrive`` (dry run), ``skipped`` (already
    re-driven), ``refused`` (cannot be: the message says why) or ``failed`` (the publish failed)."""

    offset: int
    action: RedriveAction
    detail: str
    source: str | None = None
    target_offset: int | None = None
    value_from: ValueFrom | None = None

    @property
    def ok(self) -> bool:
        return self.action in ("redriven", "would_redrive", "skipped")

    def as_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "action": self.action, "detail": self.detail, "source": self.source,
                "target_offset": self.target_offset, "value_from": self.value_from}


def readable(data: bytes | None) -> str | None:
    """Bytes for a person: the text when they are UTF-8 without control characters, else ``base64:…``."""
    if data is None:
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\n\t" for c in text):
        return text
    return "base64:" + base64.b64encode(data).decode()


__all__ = ["REDRIVE_HEADER", "LetterDetails", "RedriveAction", "RedriveResult", "StoredLetter", "ValueFrom",
           "readable"]
