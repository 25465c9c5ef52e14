"""What the middlewares share: the ``Delivery`` a record travels in, and ``compose``.

A middleware is an object called with the delivery and the rest of the chain (``call_next``): it may
act before and after calling it, call it several times (retries), or not at all (a duplicate, a record
dead-lettered). Outcomes travel back in the delivery (``done``, ``duplicate``, ``failure``) rather than
in exceptions: an exception out of the chain means the record is neither handled nor dead-lettered
(``Deferred``, ``Abandoned``, a cancellation, or the dead-letter topic itself failing).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from aiokafka import TopicPartition

from agentstream.streams.core.events import ClaimCheck, Event
from agentstream.streams.runtime.records import Context, Record

if TYPE_CHECKING:  # OpenTelemetry is the [worker] extra
    from agentstream.streams.telemetry.tracing import RecordSpan


@dataclass(slots=True, kw_only=True)
class Delivery:
    """One record on its way through the chain, and what the steps found out about it."""

    tp: TopicPartition
    record: Record
    value: bytes | None
    #: ``time.perf_counter()`` when handling began (handling time and stages are measured from it).
    started: float
    #: Seconds from the record's broker timestamp to when handling began.
    queue_wait: float
    #: Set by ``Decode``; read it as ``event``.
    decoded: Event | None = None
    #: The record is for another partition: forwarded, not handled (``RouteByRun``).
    misrouted: bool = False
    #: The handling span (``RecordSpan``: None when tracing is off or the run is not sampled).
    span: RecordSpan | None = None
    #: What the events emitted while handling carry as their ``traceparent`` (None: a child of the record's).
    out_traceparent: str | None = None
    #: The current attempt's context (``Publish``).
    ctx: Context | None = None
    #: The current attempt, from 1 (``Recover``).
    attempt: int = 1
    #: ``time.perf_counter()`` when the handler returned (``StageTiming``).
    handled_at: float = 0.0
    #: Handled (or forwarded): its outputs acknowledged; the offset may be committed past it.
    done: bool = False
    #: Dropped as a copy of an event handled recently.
    duplicate: bool = False
    #: Why the handler failed for good (it was dead-lettered): "{kind}: {error}".
    failure: str | None = None

    @property
    def event(self) -> Event:
        """The decoded event (for the steps after ``Decode``)."""
        if self.decoded is None:
            raise RuntimeError(f"{self.record.topic}[{self.record.partition}]@{self.record.offset} is not "
                               "decoded yet: this middleware must come after Decode in the chain")
        return self.decoded

    @property
    def event_type(self) -> str:
        """The event's type name (the type a claim check stands for), as spans and metrics label it."""
        event = self.event
        return event.event_type.rsplit(".", 1)[-1] if isinstance(event, ClaimCheck) else type(event).__name__

    @property
    def remembered(self) -> bool:
        """The handler did not ask to ``forget`` the event's id."""
        return self.ctx is None or self.ctx.remembered


#: The rest of the chain.
Next = Callable[[Delivery], Awaitable[None]]


class Middleware(Protocol):
    async def __call__(self, delivery: Delivery, call_next: Next) -> None: ...


def compose(middlewares: Sequence[Middleware], endpoint: Next) -> Next:
    """One callable running ``middlewares`` (the first outermost) around ``endpoint``. Built once per
    service: a record's trip costs one call per middleware, no lookups."""
    call = endpoint
    for middleware in reversed(middlewares):
        call = functools.partial(middleware, call_next=call)
    return call


__all__ = ["Delivery", "Middleware", "Next", "compose"]
