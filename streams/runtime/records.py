"""What a service's handler deals with: the consumed ``Record``, the ``Context`` it emits through, and
the ``ServiceConfig`` (with its ``RetryPolicy``) that says how the runtime consumes for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import asyncpg
from aiokafka.structs import RecordMetadata

from agentstream.streams.core.events import Event
from agentstream.streams.core.outages import backoff
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.headers import SOURCE_HEADER
from agentstream.streams.telemetry import trace_context as tracing

if TYPE_CHECKING:  # prometheus-client is the [worker] extra: a client imports none of it
    from agentstream.streams.runtime.publisher import Runtime
    from agentstream.streams.telemetry.metrics import ServiceMetrics
    from agentstream.streams.telemetry.stages import StageClock

#: Probes of a service's dependencies by name (``agentstream.streams.core.outages``): return normally when it answers.
Probe = Callable[[], Awaitable[object]]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How often a failing record is tried, and how long between tries (an outage is waited out apart:
    ``ServiceConfig.outage_backoff_s``)."""

    max_attempts: int = 4
    backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return backoff(attempt, base_s=self.backoff_s, cap_s=self.max_backoff_s)


@dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """How one service consumes. Defaults suit a service whose handler does I/O per record."""

    name: str
    topics: Sequence[str]
    group_id: str
    concurrency: int = 32
    max_in_flight: int = 2000
    max_poll_records: int = 500
    commit_interval_s: float = 0.05
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 1_000
    fetch_max_wait_ms: int = 100
    shutdown_grace_s: float = 10.0
    dedup_capacity: int = 100_000
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: The longest wait between two tries of a record during an outage.
    outage_backoff_s: float = 5.0
    #: Forward an event that arrived on another partition than its run's (``middleware/routing.py``).
    route_by_run: bool = False
    #: More keys a record is ordered by, besides its Kafka key: it is handled after every earlier record
    #: that shares one of them (the planner: a turn of a session after the session's earlier turns).
    order_keys: Callable[[Record], Sequence[bytes]] | None = None
    #: Told of every record this service dead-letters (after the letter is published): the planner
    #: answers a task that could not become a run with a ``RunFailed``, so its producer is not left
    #: waiting (services/planner/refusals.py).
    on_rejected: Callable[[Record, str, str], Awaitable[None]] | None = None


def is_retriable(exc: BaseException) -> bool:
    """Errors that say so, and transaction conflicts, are worth a few more tries (an outage — a lost
    connection, a broker away — is waited out instead: ``agentstream.streams.core.outages.outage_of``)."""
    if getattr(exc, "retriable", False):
        return True
    return isinstance(exc, (asyncpg.exceptions.SerializationError, asyncpg.exceptions.DeadlockDetectedError))


@dataclass
class Record:
    """Where a consumed event came from."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp_ms: int
    headers: dict[str, bytes]
    consumed_at: datetime
    #: How often a handler put this record aside (``Deferred``) before this try.
    deferrals: int = 0

    @property
    def source(self) -> str:
        return (f"{self.topic}:{self.partition}:{self.offset}:{self.timestamp_ms}:"
                f"{int(self.consumed_at.timestamp() * 1e6)}")

    @property
    def appended_at(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp_ms / 1000, UTC)


class Context:
    """Handed to a handler with each event: emit outputs, read where the event came from.

    ``traceparent`` is the handled record's; ``out_traceparent`` is what the events it emits carry (the
    handling span's context, or a child id of the same trace when tracing is off); ``span`` is the
    handling span (None when tracing is off or outside the runtime) for handlers to add attributes to.
    """

    def __init__(self, runtime: Runtime, service: str, record: Record, *, out_traceparent: str | None = None,
                 span: object | None = None, metrics: ServiceMetrics | None = None) -> None:
        self.runtime = runtime
        self.service = service
        self.record = record
        self.traceparent = tracing.valid(record.headers.get(tracing.HEADER))
        self.out_traceparent = out_traceparent or tracing.child_of(self.traceparent)
        self.span = span
        self._metrics = metrics
        self._source: bytes | None = None
        self._pending: list[asyncio.Future[RecordMetadata]] = []
        self._clock: StageClock | None = None
        self._created = 0.0
        #: Whether the runtime counts the event's id as handled once the handler returns (``forget``).
        self.remembered = True

    @property
    def topics(self) -> Topics:
        return self.runtime.topics

    async def emit(self, topic: str, event: Event, *, key: str | None = None,
                   traceparent: str | None = None) -> None:
        """Publish ``event`` now; the record is not done until the broker acknowledged it."""
        if self._source is None:
            self._source = self.record.source.encode()
        headers = [(tracing.HEADER, (traceparent or self.out_traceparent).encode()), (SOURCE_HEADER, self._source)]
        self._pending.append(await self.runtime.send(topic, event, key=key, headers=headers))
        clock = self._clock
        if clock is not None and topic not in (self.topics.tokens, self.topics.runs):
            # The time to the event that carries the run on: a record's share of the critical path.
            clock.since(f"{self.service}.to_send", self._created)
            self._clock = None
        if self._metrics is not None:
            self._metrics.emitted(type(event)).inc()

    def time_first_send(self, clock: StageClock) -> None:
        """Record on ``clock`` the time from now to the first event emitted that carries the run on
        (``{service}.to_send``). The stage-timing middleware asks for it; nothing else should."""
        self._clock = clock
        self._created = time.perf_counter()

    def forget(self) -> None:
        """Do not count this event's id as handled: a later record with the same id is handled again. For
        a record refused for what it claims to be (the tool service refusing a forged request): event ids
        are predictable, and a forgery that borrowed a real request's id must not make the real one,
        arriving later, a duplicate to drop."""
        self.remembered = False

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.gather(*pending)


#: A service's handler: the event (a claim check already redeemed) and its record's context.
Handler = Callable[[Event, Context], Awaitable[None]]

__all__ = ["Context", "Handler", "Probe", "Record", "RetryPolicy", "ServiceConfig", "is_retriable"]
