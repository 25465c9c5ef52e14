"""W3C trace context (``traceparent``) carried in a Kafka header from event to event.

Each run gets a trace id when it is submitted; every event a service emits while handling an event
gets a new span id under the same trace, so one run is one trace across every hop.
"""

from __future__ import annotations

import secrets

HEADER = "traceparent"


def new_traceparent() -> str:
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def child_of(parent: str | None) -> str:
    """A traceparent for an event caused by ``parent`` (a fresh trace when there is none or it is malformed)."""
    parts = parent.split("-") if parent else []
    if len(parts) != 4 or len(parts[1]) != 32:
        return new_traceparent()
    return f"00-{parts[1]}-{secrets.token_hex(8)}-{parts[3]}"


def trace_id(traceparent: str | None) -> str | None:
    parts = traceparent.split("-") if traceparent else []
    return parts[1] if len(parts) == 4 else None
