"""W3C trace context (``traceparent``) carried in a Kafka header from event to event.

Each run gets a trace id when it is submitted; every event a service emits while handling an event
carries the context of that handling, so one run is one trace across every hop.

This module is the cheap part that always runs: it formats and parses header values and never imports
OpenTelemetry. When tracing is on (``AGENTSTREAM_TRACING``), ``agentstream.streams.telemetry.tracing`` installs a
hook here so that ``new_traceparent()`` — what a client calls when it submits a task — starts the run's
root span, and the runtime makes one span per handled record (``streams/runtime/middleware/tracing.py``).
"""

from __future__ import annotations

import contextvars
import re
import secrets
from collections.abc import Callable

HEADER = "traceparent"

#: The traceparent of the record being handled in this task (set by the runtime): events sent from
#: inside a handler without an explicit one (a tool asking the retrieval service) join the run's trace.
CURRENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("agentstream_traceparent", default=None)


class RootSpans:
    """Who makes a new run's traceparent: with tracing on, its ``Tracing`` (a root span, which
    ``Runtime.send`` ends when the task is acknowledged); else random ids. One object for the process
    (``ROOTS``): ``agentstream.streams.telemetry.tracing`` installs the process's tracing here, and the
    first ``traceparent()`` before that looks the environment up once."""

    __slots__ = ("_resolved", "_start")

    def __init__(self) -> None:
        self._start: Callable[[], str] | None = None
        self._resolved = False

    def install(self, start: Callable[[], str] | None) -> None:
        """Make ``start`` (``Tracing.root_traceparent``) what new runs' traceparents come from; None: random."""
        self._start = start
        self._resolved = True

    def traceparent(self) -> str:
        if not self._resolved:
            self._resolved = True
            from agentstream.streams.telemetry.tracing import process_tracing

            process_tracing()  # installs the process's tracing here when the environment turns it on
        if self._start is not None:
            return self._start()
        return random_traceparent()


#: The process's (``RootSpans``).
ROOTS = RootSpans()


def set_root_hook(hook: Callable[[], str] | None) -> None:
    """Installed by ``agentstream.streams.telemetry.tracing``: makes ``new_traceparent()`` start a root span."""
    ROOTS.install(hook)


def new_traceparent() -> str:
    """The traceparent of a new run (a root span when tracing is on, random ids otherwise)."""
    return ROOTS.traceparent()


def random_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


def valid(header: bytes | None) -> str | None:
    """A record's ``traceparent`` header if it is one (W3C Trace Context: version, trace id, parent id,
    flags, lower-case hex; the all-zero ids are invalid), else None. A producer's header is input like any
    other: a junk value must not be stored on the run nor passed on (one of 100,000 characters was kept on
    the run's row until the hostile suite sent it)."""
    if not header or len(header) != 55:
        return None
    text = header.decode("ascii", errors="replace")
    if not _TRACEPARENT.fullmatch(text) or text[3:35] == "0" * 32 or text[36:52] == "0" * 16 or text[:2] == "ff":
        return None
    return text


def child_of(parent: str | None) -> str:
    """A traceparent for an event caused by ``parent`` (a fresh trace when there is none or it is malformed)."""
    parts = parent.split("-") if parent else []
    if len(parts) != 4 or len(parts[1]) != 32:
        return random_traceparent()
    return f"00-{parts[1]}-{secrets.token_hex(8)}-{parts[3]}"


def trace_id(traceparent: str | None) -> str | None:
    parts = traceparent.split("-") if traceparent else []
    return parts[1] if len(parts) == 4 else None
