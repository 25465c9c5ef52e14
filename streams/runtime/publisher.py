"""The producer side every service and client shares: ``Runtime`` — settings, topics, the codec, one
idempotent producer, claim checks for events too large for a record, and the process's telemetry
(tracing, metrics, the benchmark's stage clock), built once at process start and handed down.

The transport knows no event type: headers that depend on the event (the prompt-token estimate a
model request carries for the backlog signal) come from hooks its producer registers
(``add_header_hook``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar, cast

from aiokafka import AIOKafkaProducer
from aiokafka.errors import OutOfOrderSequenceNumber, ProducerFenced
from aiokafka.structs import RecordMetadata

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError, EventTooLarge
from agentstream.streams.core.events import ClaimCheck, Event
from agentstream.streams.kafka.claims import ClaimStore
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.topics import Topics, key_partitioner
from agentstream.streams.runtime.headers import TYPE_HEADER
from agentstream.streams.telemetry import stages
from agentstream.streams.telemetry import trace_context as tracing

if TYPE_CHECKING:  # prometheus-client and OpenTelemetry are the [worker] extra: a client imports neither
    from agentstream.streams.telemetry.metrics import Metrics
    from agentstream.streams.telemetry.stages import StageClock
    from agentstream.streams.telemetry.tracing import Tracing

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)
#: Errors after which an aiokafka producer is dead for good: its sender stops, fails every pending record
#: and every later send with the same error. Seen when the node leading a partition was killed (the chaos
#: suite's first ``--secure`` runs, on topics that then had one replica by the suite's mistake): the leader
#: answered a retried batch with OUT_OF_ORDER_SEQUENCE_NUMBER, and the process dead-lettered every record it
#: handled after that. Kafka's Java client bumps its producer epoch and goes on (KIP-360);
#: aiokafka has no such path, so the runtime puts a new producer (a new producer id, sequences from 0) in
#: its place and the records that failed are sent again by their handlers' retries (consumers drop a
#: copy by its event id).
DEAD_PRODUCER_ERRORS: tuple[type[BaseException], ...] = (OutOfOrderSequenceNumber, ProducerFenced)
#: How long a dead producer may take to close (its records failed already; nothing is flushed).
_DEAD_STOP_S = 5.0
#: Headers for one event, from its type's hook (``Runtime.add_header_hook``).
HeaderHook = Callable[[Event], Iterable[tuple[str, bytes]]]


class _Default(enum.Enum):
    """``Runtime(tracing=..., stages=...)`` left out: the process's, as its settings and environment say."""

    PROCESS = "the process's"


_PROCESS = _Default.PROCESS


def _process_tracing(settings: Settings) -> Tracing | None:
    """The process's tracing (``telemetry.tracing.tracing_for``). OpenTelemetry is imported only when
    tracing is configured or a worker in this process already set it up, so that a client installed
    without the ``[worker]`` extra runs with tracing off instead of failing to import."""
    if not settings.telemetry.tracing_enabled and "agentstream.streams.telemetry.tracing" not in sys.modules:
        return None
    from agentstream.streams.telemetry.tracing import tracing_for

    return tracing_for(settings.telemetry, settings.paths)


class Runtime:
    """What the services of one process share: settings, topics, the codec and one producer — and the
    process's telemetry, read once here and handed down with it: ``tracing`` (default: as the settings
    say), ``metrics`` (default: none) and ``stages``, the benchmark's stage clock (default: the
    process's, set by ``AGENTSTREAM_STAGES_DIR``; None when off)."""

    def __init__(self, settings: Settings, codec: Codec, *, linger_ms: int = 0,
                 tracing: Tracing | _Default | None = _PROCESS, metrics: Metrics | None = None,
                 stages: StageClock | _Default | None = _PROCESS) -> None:
        self.settings = settings
        self.codec = codec
        self.tracing: Tracing | None = (_process_tracing(settings) if isinstance(tracing, _Default)
                                        else tracing)
        self.metrics = metrics
        self.stages: StageClock | None = _process_stages() if isinstance(stages, _Default) else stages
        self.topics = Topics.of(settings)
        self._linger_ms = linger_ms
        self.producer = self._new_producer()
        #: Producers replaced after a fatal error (``DEAD_PRODUCER_ERRORS``), for logs and tests.
        self.producer_renewals = 0
        self._renewing: asyncio.Task[None] | None = None
        self._started = False
        self._header_hooks: dict[type[Event], HeaderHook] = {}
        #: Where events over ``settings.max_event_bytes`` go (a worker sets it; clients have none).
        self.claims: ClaimStore | None = None

    def add_header_hook(self, event_type: type[E], hook: Callable[[E], Iterable[tuple[str, bytes]]]) -> None:
        """Add ``hook(event)``'s headers to every event of exactly ``event_type`` sent from now on (after
        the type and trace headers). The producer of an event type registers what its consumers read
        there: the planner, a model request's prompt tokens (``telemetry.backlog.prompt_tokens_header``)."""
        self._header_hooks[event_type] = cast(HeaderHook, hook)

    def _new_producer(self) -> AIOKafkaProducer:
        return AIOKafkaProducer(
            **self.settings.kafka_options(), acks="all", enable_idempotence=True,
            linger_ms=self._linger_ms, request_timeout_ms=self.settings.kafka_request_timeout_ms,
            partitioner=key_partitioner,
        )

    async def start(self) -> None:
        if not self._started:
            await self.producer.start()
            self._started = True

    def _check_delivery(self, producer: AIOKafkaProducer, future: asyncio.Future[RecordMetadata]) -> None:
        if not future.cancelled() and (error := future.exception()) is not None:
            self._renew_after(producer, error)

    def _renew_after(self, dead: AIOKafkaProducer, error: BaseException) -> None:
        """Replace ``dead`` (once, however many of its records fail) if ``error`` killed it."""
        if not isinstance(error, DEAD_PRODUCER_ERRORS) or self.producer is not dead or not self._started:
            return
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.get_running_loop().create_task(self._renew(dead, error))

    async def _renew(self, dead: AIOKafkaProducer, error: BaseException) -> None:
        log.warning("the Kafka producer stopped on %s: %s; a new one takes its place", type(error).__name__, error)
        fresh = self._new_producer()
        await fresh.start()
        self.producer = fresh
        self.producer_renewals += 1
        with contextlib.suppress(Exception):
            await asyncio.wait_for(dead.stop(), _DEAD_STOP_S)

    async def _producer(self) -> AIOKafkaProducer:
        """The producer to send with: once a renewal is under way, the new one."""
        renewing = self._renewing
        if renewing is not None and not renewing.done():
            await asyncio.shield(renewing)
        return self.producer

    async def publish_schemas(self) -> int:
        """Publish the schemas this process writes with to the schemas topic (``streams/kafka/schema_log.py``),
        so processes with other versions of them can read what it writes; call it after ``start`` and
        before sending. Returns how many (0 with an HTTP registry, which serves ids itself)."""
        if self.codec.schemas is None:
            return 0
        return await self.codec.schemas.publish(self.producer)

    async def stop(self) -> None:
        if self._renewing is not None and not self._renewing.done():
            with contextlib.suppress(Exception):
                await self._renewing
        await self.producer.stop()  # flushes what is pending (and closes one never started: no warning)
        await self.codec.close()
        self._started = False

    async def send(self, topic: str, event: Event, *, key: str | None = None,
                   headers: Sequence[tuple[str, bytes]] = ()) -> asyncio.Future[RecordMetadata]:
        """Queue ``event`` for ``topic`` (keyed by its run unless ``key`` says otherwise); the returned
        future resolves when the broker has acknowledged it.

        Without a ``traceparent`` in ``headers``, the event joins the trace of the record being handled
        in this task (if any). Its type's header hook, if one was registered, adds its headers."""
        hdrs = [(TYPE_HEADER, type(event).__name__.encode()), *headers]
        traceparent = next((v for k, v in headers if k == tracing.HEADER), None)
        if traceparent is None:
            current = tracing.CURRENT.get()
            if current is not None:
                hdrs.append((tracing.HEADER, current.encode()))
        if self._header_hooks:
            hook = self._header_hooks.get(type(event))
            if hook is not None:
                hdrs.extend(hook(event))
        value = self.codec.encode(event)
        if len(value) > self.settings.max_event_bytes:
            value = await self._claim_check(event, value)
        clock = self.stages
        sent = time.perf_counter() if clock is not None else 0.0
        # Rounded, not truncated (aiokafka's default): the record timestamp is where hop latencies are
        # measured from, and truncating to the millisecond made every hop look 0.5 ms longer on average.
        producer = await self._producer()
        try:
            future = await producer.send(topic, value, key=(key if key is not None else event.run_id).encode(),
                                         headers=hdrs, timestamp_ms=round(time.time() * 1000))
        except DEAD_PRODUCER_ERRORS as exc:  # it died before: its successor takes this record's retry
            self._renew_after(producer, exc)
            raise
        future.add_done_callback(lambda f: self._check_delivery(producer, f))
        if clock is not None:
            future.add_done_callback(lambda _f: clock.since("produce", sent))
        tr = self.tracing
        if traceparent is not None and tr is not None and tr.has_pending_roots:
            root = tr.claim_root(traceparent.decode(errors="replace"))
            if root is not None:  # the client's submit: the run's root span ends when the task is acked
                root.update_name(f"submit {type(event).__name__}")
                root.set_attributes({"agentstream.run_id": event.run_id, "agentstream.step_id": event.step_id,
                                     "messaging.system": "kafka", "messaging.destination.name": topic})
                future.add_done_callback(lambda _f: root.end())
        return future

    async def _claim_check(self, event: Event, value: bytes) -> bytes:
        """The encoded claim check that stands in for ``event`` (whose encoding is ``value``)."""
        if self.claims is None:
            raise EventTooLarge(f"{type(event).__name__} {event.step_id} is {len(value)} bytes encoded, over the "
                                f"{self.settings.max_event_bytes}-byte limit (AGENTSTREAM_MAX_EVENT_BYTES), and "
                                "this process has no database for a claim check")
        return self.codec.encode(await self.claims.check_in(event, value))

    async def redeem(self, event: Event) -> Event:
        """The event a claim check stands for (any other event as it is)."""
        if not isinstance(event, ClaimCheck):
            return event
        if self.claims is None:
            raise EventTooLarge(f"{event.event_type} {event.step_id} came as a claim check and this process "
                                "has no database to read it from")
        redeemed = await self.codec.decode_async(await self.claims.redeem(event), raise_outages=True)
        if (redeemed.schema_name, redeemed.event_id, redeemed.run_id) != (event.event_type, event.event_id,
                                                                         event.run_id):
            # The topic's check judged the claim by the type it names: the body must be that event.
            raise DecodeError("invalid", f"claim check {event.event_id} of {event.run_id} names a "
                                         f"{event.event_type}, its body is {type(redeemed).__name__} "
                                         f"{redeemed.event_id} of another run or step")
        return redeemed


def _process_stages() -> StageClock | None:
    """The process's stage clock (``telemetry.stages.PROCESS``: the environment, read once)."""
    return stages.clock()


__all__ = ["HeaderHook", "Runtime"]
