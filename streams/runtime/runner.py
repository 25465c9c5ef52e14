"""The consumer runtime every service runs on: decode → de-duplicate → handle → publish → commit.

Guarantees (see docs/architecture.md):

- at-least-once: a record counts as done only after its handler returned, everything it emitted was
  acknowledged by the broker (``acks=all``, idempotent producer) and its database writes committed
  (handlers commit before returning); offsets are committed only up to the highest *contiguous* done
  record of each partition;
- records with the same key (a run) are handled one after another, others in parallel, at most
  ``concurrency`` at a time; past ``max_in_flight`` records the runtime pauses fetching;
- a record that cannot be decoded or is invalid, or whose handler fails for good, goes to the
  dead-letter topic with the reason, and the service carries on; so does an event its topic does not
  carry (``streams/kafka/channels.py``: a model reply on the intake is refused, whoever may write the
  intake); a schema id this process does not know is first looked up in the schemas topic
  (``streams/kafka/schema_log.py``: another release's schema);
- an outage is not a failure (``streams/core/outages.py``): a handler that fails because PostgreSQL, the
  broker or the model server is unreachable is retried with capped backoff for as long as the outage
  lasts, with its partition paused, and readiness says so; attempts made while the dependency's probe
  fails do not count towards ``RetryPolicy.max_attempts``;
- partitions are assigned by number and stickily (``streams/kafka/assignor.py``): a member owns partition
  ``p`` of every topic it reads, so a service that joins topics by run (the planner) sees all of a
  run's events; with ``route_by_run``, an event that arrived on another partition than its run's, or
  not keyed by its run id (a third-party producer with another partitioner: librdkafka's default is
  CRC32, Kafka's murmur2), is forwarded there, not handled;
- a handler may put a record aside (``Deferred``: what it answers is still to be redone from another
  record); it stays uncommitted while its key's next records go on, and is handed over again later;
- an event too large for a record travels as a claim check (``streams/kafka/claims.py``), transparently;
- on shutdown or revocation, in-flight records get ``shutdown_grace_s`` to finish; the rest are
  cancelled uncommitted (the next owner redoes them), done offsets are committed, the group is left.

Telemetry (``streams/telemetry/``) hooks in here: with tracing on, handling a record is one span
(``"{service} {EventType}"``), child of the record's ``traceparent`` header, and every event the handler
emits carries that span's context; with metrics on, each record observes its handling time and queue
wait on precreated label children. Both are ``None`` checks when off.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError
from aiokafka.structs import RecordMetadata

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError, EventTooLarge
from agentstream.streams.core.events import ClaimCheck, Event, InferenceRequested
from agentstream.streams.core.kinds import DeadLetterKind
from agentstream.streams.core.outages import Outage, Outages, backoff, outage_of
from agentstream.streams.core.signals import Abandoned, Deferred
from agentstream.streams.kafka.assignor import copartitioned
from agentstream.streams.kafka.channels import accepted_events, refusal
from agentstream.streams.kafka.claims import ClaimStore
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.consumer_stop import stop_consumer
from agentstream.streams.kafka.topics import Topics, key_partitioner
from agentstream.streams.runtime.dead_letters import Rejected, publish_dead_letter
from agentstream.streams.runtime.offsets import OffsetTracker
from agentstream.streams.telemetry import stages
from agentstream.streams.telemetry import trace_context as tracing
from agentstream.streams.telemetry.backlog import PROMPT_TOKENS_HEADER, estimate_prompt_tokens

if TYPE_CHECKING:  # prometheus-client and OpenTelemetry are the [worker] extra: a client imports neither
    from agentstream.streams.telemetry.metrics import Metrics, ServiceMetrics
    from agentstream.streams.telemetry.tracing import Tracing

log = logging.getLogger(__name__)

TYPE_HEADER = "agentstream-type"
#: Set on every event emitted while handling a record: "topic:partition:offset:appended_ms:consumed_us"
#: of that record (appended: the Kafka record timestamp), so the planner can record where and when the
#: request it answers was sent and consumed.
SOURCE_HEADER = "agentstream-source"
#: On a record the runtime forwarded to its run's partition: "topic:partition:offset" it came from.
ROUTED_HEADER = "agentstream-routed-from"
#: Probes of a service's dependencies by name (``agentstream.streams.core.outages``): return normally when it answers.
Probe = Callable[[], Awaitable[object]]


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
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
    #: Forward an event that arrived on another partition than its run's (see the module docstring).
    route_by_run: bool = False


def is_retriable(exc: BaseException) -> bool:
    """Errors that say so, and transaction conflicts, are worth a few more tries (an outage — a lost
    connection, a broker away — is waited out instead: ``agentstream.streams.core.outages.outage_of``)."""
    if getattr(exc, "retriable", False):
        return True
    return isinstance(exc, (asyncpg.exceptions.SerializationError, asyncpg.exceptions.DeadlockDetectedError))


class _Default(enum.Enum):
    """``Runtime(tracing=...)`` left out: the process's tracing, as the settings say."""

    FROM_SETTINGS = "from settings"


_FROM_SETTINGS = _Default.FROM_SETTINGS


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
    process's telemetry: ``tracing`` (default: as the settings say) and ``metrics`` (default: none)."""

    def __init__(self, settings: Settings, codec: Codec, *, linger_ms: int = 0,
                 tracing: Tracing | _Default | None = _FROM_SETTINGS, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.codec = codec
        self.tracing: Tracing | None = (_process_tracing(settings) if isinstance(tracing, _Default)
                                        else tracing)
        self.metrics = metrics
        self.topics = Topics.of(settings)
        self.producer = AIOKafkaProducer(
            **settings.kafka_options(), acks="all", enable_idempotence=True,
            linger_ms=linger_ms, request_timeout_ms=settings.kafka_request_timeout_ms,
            partitioner=key_partitioner,
        )
        self._started = False
        #: Where events over ``settings.max_event_bytes`` go (a worker sets it; clients have none).
        self.claims: ClaimStore | None = None

    async def start(self) -> None:
        if not self._started:
            await self.producer.start()
            self._started = True

    async def publish_schemas(self) -> int:
        """Publish the schemas this process writes with to the schemas topic (``streams/kafka/schema_log.py``),
        so processes with other versions of them can read what it writes; call it after ``start`` and
        before sending. Returns how many (0 with an HTTP registry, which serves ids itself)."""
        if self.codec.schemas is None:
            return 0
        return await self.codec.schemas.publish(self.producer)

    async def stop(self) -> None:
        await self.producer.stop()  # flushes what is pending (and closes one never started: no warning)
        await self.codec.close()
        self._started = False

    async def send(self, topic: str, event: Event, *, key: str | None = None,
                   headers: Sequence[tuple[str, bytes]] = ()) -> asyncio.Future[RecordMetadata]:
        """Queue ``event`` for ``topic`` (keyed by its run unless ``key`` says otherwise); the returned
        future resolves when the broker has acknowledged it.

        Without a ``traceparent`` in ``headers``, the event joins the trace of the record being handled
        in this task (if any). A model request carries its estimated prompt tokens (the backlog signal
        autoscaling reads, ``streams/telemetry/backlog.py``)."""
        hdrs = [(TYPE_HEADER, type(event).__name__.encode()), *headers]
        traceparent = next((v for k, v in headers if k == tracing.HEADER), None)
        if traceparent is None:
            current = tracing.CURRENT.get()
            if current is not None:
                hdrs.append((tracing.HEADER, current.encode()))
        if type(event) is InferenceRequested:
            hdrs.append((PROMPT_TOKENS_HEADER, b"%d" % estimate_prompt_tokens(event)))
        value = self.codec.encode(event)
        if len(value) > self.settings.max_event_bytes:
            value = await self._claim_check(event, value)
        clock = stages.clock()
        sent = time.perf_counter() if clock is not None else 0.0
        # Rounded, not truncated (aiokafka's default): the record timestamp is where hop latencies are
        # measured from, and truncating to the millisecond made every hop look 0.5 ms longer on average.
        future = await self.producer.send(topic, value, key=(key if key is not None else event.run_id).encode(),
                                          headers=hdrs, timestamp_ms=round(time.time() * 1000))
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
        self.traceparent = (record.headers.get(tracing.HEADER) or b"").decode() or None
        self.out_traceparent = out_traceparent or tracing.child_of(self.traceparent)
        self.span = span
        self._metrics = metrics
        self._source: bytes | None = None
        self._pending: list[asyncio.Future[RecordMetadata]] = []
        self._clock = stages.clock()
        self._created = time.perf_counter() if self._clock is not None else 0.0
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


Handler = Callable[[Event, Context], Awaitable[None]]


class _Dedup:
    """Event ids this instance finished recently (a redelivery after a rebalance is dropped)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._seen

    def add(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, runner: ServiceRunner) -> None:
        self.runner = runner

    async def on_partitions_revoked(self, revoked: AbstractSet[TopicPartition]) -> None:
        await self.runner._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: AbstractSet[TopicPartition]) -> None:
        await self.runner._on_assigned(set(assigned))


class ServiceRunner:
    """Runs one service's handler over its topics until ``stop()``."""

    def __init__(self, runtime: Runtime, config: ServiceConfig, handler: Handler, *,
                 on_assigned: Callable[[set[TopicPartition]], Awaitable[None]] | None = None,
                 on_revoked: Callable[[set[TopicPartition]], Awaitable[None]] | None = None,
                 probes: dict[str, Probe] | None = None) -> None:
        self.runtime = runtime
        self.config = config
        self.handler = handler
        self._on_assigned_cb = on_assigned
        self._on_revoked_cb = on_revoked
        self.tracker = OffsetTracker()
        self.dedup = _Dedup(config.dedup_capacity)
        self._sem = asyncio.Semaphore(config.concurrency)
        self._tails: dict[bytes, asyncio.Task[None]] = {}
        self._tasks: dict[TopicPartition, set[asyncio.Task[None]]] = {}
        self._stopping = asyncio.Event()
        self._joined = asyncio.Event()
        self.consumer: AIOKafkaConsumer | None = None
        self.stats = {"processed": 0, "dead_lettered": 0, "duplicates": 0, "retries": 0, "outage_retries": 0,
                      "routed": 0, "abandoned": 0, "deferred": 0}
        #: Records put aside by their handler (``Deferred``), waiting to be handed over again, by partition.
        self._deferred: dict[TopicPartition, set[asyncio.Task[None]]] = {}
        #: Dependencies being waited out now (readiness reports them).
        self.outages = Outages()
        #: How to tell whether a dependency answers (``database``: a trivial query), by name.
        self.probes: dict[str, Probe] = dict(probes or {})
        #: Partitions paused because a record of theirs waits for a dependency: how many records.
        self._held: dict[TopicPartition, int] = {}
        #: The partitions this runner paused (others may pause more: a test, an operator).
        self._paused: set[TopicPartition] = set()
        self._failure: BaseException | None = None
        self._tracing = runtime.tracing
        #: Per-stage timings for ``bench/pipeline.py --breakdown`` (None unless AGENTSTREAM_STAGES_DIR is set).
        self._stages = stages.clock()
        self._metrics: ServiceMetrics | None = (
            runtime.metrics.service(config.name, lambda: self.tracker.in_flight) if runtime.metrics else None)
        #: The events each topic of the contract carries (``streams/kafka/channels.py``): anything else is refused.
        self._accepted = accepted_events(runtime.topics)

    @property
    def joined(self) -> bool:
        """Partitions were assigned to this member (its readiness, with the service's own)."""
        return self._joined.is_set()

    @property
    def stopping(self) -> bool:
        """``stop()`` was called, or the service failed: not ready any more."""
        return self._stopping.is_set()

    # -- lifecycle -----------------------------------------------------------------------------
    async def run(self) -> None:
        """Join the group, process until ``stop()``, then shut down gracefully."""
        cfg = self.config
        self.consumer = AIOKafkaConsumer(
            **self.runtime.settings.kafka_options(), group_id=cfg.group_id,
            enable_auto_commit=False, auto_offset_reset="earliest", isolation_level="read_committed",
            max_poll_records=cfg.max_poll_records, session_timeout_ms=cfg.session_timeout_ms,
            heartbeat_interval_ms=cfg.heartbeat_interval_ms, fetch_max_wait_ms=cfg.fetch_max_wait_ms,
            client_id=f"agentstream-{cfg.name}", partition_assignment_strategy=(copartitioned(),),
            request_timeout_ms=self.runtime.settings.kafka_request_timeout_ms,
        )
        await self.consumer.start()
        self.consumer.subscribe(list(cfg.topics), listener=_Listener(self))
        committer = asyncio.create_task(self._commit_loop(), name=f"{cfg.name}-commit")
        try:
            await self._fetch_loop()
        finally:
            await self._cancel_deferred(set(self._deferred))
            await self._drain(set(self._tasks), cfg.shutdown_grace_s)
            committer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await committer
            await self._commit()
            await stop_consumer(self.consumer, cfg.name)  # leaves the group
        if self._failure is not None:
            raise self._failure

    def stop(self) -> None:
        self._stopping.set()

    def fail(self, exc: BaseException) -> None:
        """Stop because the service cannot go on in this process (its in-process engine died): readiness
        says so at once, in-flight records drain as on shutdown, and ``run()`` raises ``exc`` so that the
        worker exits non-zero and its supervisor restarts it. The path a record that can be neither
        handled nor dead-lettered already takes; a handler that calls this raises ``Abandoned`` for its
        record, which the partition's next owner then handles."""
        self._failure = self._failure or exc
        self._stopping.set()

    async def wait_joined(self, timeout: float = 60.0) -> None:
        """Until partitions were assigned to this member (tests and benchmarks wait for it)."""
        await asyncio.wait_for(self._joined.wait(), timeout)

    # -- fetching ------------------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        assert self.consumer is not None
        low_water = self.config.max_in_flight // 2
        backlogged = False
        while not self._stopping.is_set():
            if not backlogged and self.tracker.in_flight >= self.config.max_in_flight:
                backlogged = True
            elif backlogged and self.tracker.in_flight <= low_water:
                backlogged = False
            self._apply_pauses(backlogged)
            # Keep polling while paused: the call keeps the member alive (max.poll.interval).
            batch = await self.consumer.getmany(timeout_ms=100, max_records=self.config.max_poll_records)
            now = datetime.now(UTC)
            for tp, messages in batch.items():
                for msg in messages:
                    self.tracker.started(tp, msg.offset)
                    record = Record(topic=msg.topic, partition=msg.partition, offset=msg.offset, key=msg.key,
                                    timestamp_ms=msg.timestamp, headers=dict(msg.headers or ()),
                                    consumed_at=now)
                    self._schedule(tp, record, msg.value)

    def _apply_pauses(self, backlogged: bool) -> None:
        """Pause every partition while too much is in flight, and those whose records wait out an outage."""
        assert self.consumer is not None
        assigned = self.consumer.assignment()
        wanted = set(assigned) if backlogged else {tp for tp in self._held if tp in assigned}
        if wanted != self._paused:
            if wanted - self._paused:
                self.consumer.pause(*(wanted - self._paused))
            gone = (self._paused - wanted) & assigned
            if gone:
                self.consumer.resume(*gone)
            self._paused = wanted

    def _schedule(self, tp: TopicPartition, record: Record, value: bytes | None) -> None:
        key = record.key if record.key is not None else f"{tp}:{record.offset}".encode()
        previous = self._tails.get(key)
        task = asyncio.create_task(self._process(previous, tp, record, value))
        self._tails[key] = task
        self._tasks.setdefault(tp, set()).add(task)

        def _cleanup(t: asyncio.Task[None], key: bytes = key, tp: TopicPartition = tp) -> None:
            if self._tails.get(key) is t:
                del self._tails[key]
            self._tasks.get(tp, set()).discard(t)

        task.add_done_callback(_cleanup)

    def run_keyed(self, key: bytes, job: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run ``job`` in ``key``'s queue, after that key's in-flight records, within the concurrency
        limit, but outside any record (no offset, no retries: failures are logged). The planner's
        deadline timer uses it so a timeout never races the run's own events."""
        previous = self._tails.get(key)

        async def run() -> None:
            if previous is not None:
                await asyncio.wait([previous])
            async with self._sem:
                try:
                    await job()
                except Exception:
                    log.exception("%s: keyed job for %r failed", self.config.name, key)

        task = asyncio.create_task(run())
        self._tails[key] = task
        task.add_done_callback(lambda t: self._tails.get(key) is t and self._tails.pop(key, None))
        return task

    # -- one record ----------------------------------------------------------------------------
    async def _process(self, previous: asyncio.Task[None] | None, tp: TopicPartition, record: Record,
                       value: bytes | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # same key: in order; its failure is not ours
        try:
            async with self._sem:
                await self._handle(tp, record, value)
        except asyncio.CancelledError:
            raise
        except Deferred as exc:
            self._defer(tp, record, value, exc)
            return
        except Abandoned as exc:
            # Not ours any more: neither done nor dead-lettered; the partition's new owner redoes it.
            self.stats["abandoned"] += 1
            log.warning("%s: %s[%d]@%d abandoned: %s", self.config.name, record.topic, record.partition,
                        record.offset, exc)
            return
        except Exception as exc:
            # Neither handled nor dead-lettered (the DLQ itself is unreachable, or a bug): stop the
            # service rather than commit past the record; the next start redelivers it.
            log.exception("%s: %s[%d]@%d could not be processed or dead-lettered; stopping",
                          self.config.name, record.topic, record.partition, record.offset)
            self.fail(exc)
            return
        self.tracker.done(tp, record.offset)

    async def _handle(self, tp: TopicPartition, record: Record, value: bytes | None) -> None:
        metrics = self._metrics
        clock = self._stages
        started = time.perf_counter()
        queue_wait = time.time() - record.timestamp_ms / 1000
        if metrics is not None:
            metrics.queue_wait.observe(queue_wait if queue_wait > 0 else 0.0)
        if clock is not None:
            name = self.config.name
            consumed = record.consumed_at.timestamp()
            clock.add(f"{name}.deliver", consumed - record.timestamp_ms / 1000, at=consumed)
            clock.add(f"{name}.queue", time.time() - consumed)
        event = await self._decode(tp, record, value)
        if clock is not None:
            clock.since(f"{self.config.name}.decode", started)
        if event is None:
            return
        refused = refusal(self._accepted, record.topic, event)
        if refused is not None:
            # Not remembered as handled: a forgery may borrow the id of a real event still to come.
            log.warning("%s: %s[%d]@%d refused: %s", self.config.name, record.topic, record.partition, record.offset,
                        refused)
            await self._dead_letter(record, value, "refused", refused, run_id=event.run_id)
            return
        if event.event_id in self.dedup:
            self.stats["duplicates"] += 1
            if metrics is not None:
                metrics.duplicates.inc()
            return
        misrouted = self.config.route_by_run and (record.partition != self.runtime.topics.partition_for(event.run_id)
                                                  or record.key != event.run_id.encode())
        event_type = event.event_type.rsplit(".", 1)[-1] if isinstance(event, ClaimCheck) else type(event).__name__
        span = None
        out_traceparent = None
        if self._tracing is not None and not misrouted:
            # None when the run is not sampled; the service (hence its consumer group) and the event
            # type are in the span's name.
            parent = record.headers.get(tracing.HEADER, b"").decode(errors="replace") or None
            span, out_traceparent = self._tracing.start_record_span(self.config.name, event_type, parent, {
                "agentstream.run_id": event.run_id, "agentstream.step_id": event.step_id,
                "agentstream.queue_wait_ms": queue_wait * 1000, "messaging.destination.name": record.topic,
                "messaging.destination.partition.id": record.partition, "messaging.kafka.offset": record.offset})
        policy = self.config.retry
        attempt = 1
        outage_rounds = 0
        outage = None
        try:
            while True:
                ctx = Context(self.runtime, self.config.name, record, out_traceparent=out_traceparent, span=span,
                              metrics=metrics)
                tracing.CURRENT.set(ctx.out_traceparent)  # this task's: sends without a header join the trace
                try:
                    if misrouted:
                        await self._route(record, value, event)
                    else:
                        handling = time.perf_counter()
                        await self.handler(await self.runtime.redeem(event) if isinstance(event, ClaimCheck)
                                           else event, ctx)
                        if clock is not None:
                            clock.since(f"{self.config.name}.handle", handling)
                            handling = time.perf_counter()
                        await ctx.flush()
                        if clock is not None:
                            clock.since(f"{self.config.name}.ack", handling)
                    break
                except (asyncio.CancelledError, Abandoned, Deferred):
                    raise
                except Exception as exc:
                    if metrics is not None:
                        metrics.errors.inc()
                    dependency = outage_of(exc)
                    if dependency is not None:
                        if outage is None:
                            outage = self._hold(tp, dependency, exc)
                            log.warning("%s: %s is unavailable (%s: %s); %s waits for it, its partition paused",
                                        self.config.name, dependency, type(exc).__name__, exc, event.step_id)
                        outage_rounds += 1
                        self.stats["outage_retries"] += 1
                        if not await self._wait_out(dependency, outage_rounds):
                            continue  # the dependency is still down: this try does not count
                    retriable = dependency is not None or is_retriable(exc) or isinstance(exc, KafkaError)
                    if retriable and attempt < policy.max_attempts:
                        self.stats["retries"] += 1
                        if metrics is not None:
                            metrics.retries.inc()
                        log.info("%s: retrying %s (attempt %d): %s", self.config.name, event.step_id, attempt, exc)
                        await asyncio.sleep(policy.delay(attempt))
                        attempt += 1
                        continue
                    kind: DeadLetterKind = "retries_exhausted" if retriable else "handler_error"
                    log.exception("%s: %s on %s", self.config.name, kind, event.step_id)
                    if span is not None and self._tracing is not None:
                        self._tracing.fail(span, f"{kind}: {type(exc).__name__}: {exc}")
                    await self._dead_letter(record, value, kind, f"{type(exc).__name__}: {exc}", run_id=event.run_id)
                    self.stats["processed"] += 1
                    return  # not remembered as done: a re-driven copy (agentstream dlq redrive) is handled
        finally:
            if outage is not None:
                self._release(tp, outage)
                log.info("%s: %s went on after %d tries during the %s outage", self.config.name, event.step_id,
                         outage_rounds, outage.dependency)
            if span is not None:
                if attempt > 1 or event.attempt:
                    span.set_attributes({"agentstream.attempts": attempt, "agentstream.attempt": event.attempt})
                span.end()
        if metrics is not None:
            metrics.handled(event_type).observe(time.perf_counter() - started)
        if clock is not None:
            clock.since(f"{self.config.name}.done", started)
        # Not when misrouted: the forwarded copy, if this member owns its partition too, is still to come.
        if not misrouted and ctx.remembered:
            self.dedup.add(event.event_id)
        self.stats["processed"] += 1

    async def _decode(self, tp: TopicPartition, record: Record, value: bytes | None) -> Event | None:
        """The record's event, or None when it was dead-lettered (it cannot become a valid event). An id
        this process does not know is looked up in the schemas topic (``Codec.decode_async``); while that
        topic cannot be read (the broker is away) the record waits, its partition paused, as in an outage."""
        rounds = 0
        outage = None
        try:
            while True:
                try:
                    return await self.runtime.codec.decode_async(value, raise_outages=True)
                except DecodeError as exc:
                    log.warning("%s: %s[%d]@%d dead-lettered: %s", self.config.name, record.topic, record.partition,
                                record.offset, exc)
                    await self._dead_letter(record, value, exc.kind, exc.reason)
                    return None
                except (asyncio.CancelledError, Abandoned):
                    raise
                except Exception as exc:
                    dependency = outage_of(exc)
                    if dependency is None:
                        raise
                    if outage is None:
                        outage = self._hold(tp, dependency, exc)
                        log.warning("%s: %s[%d]@%d has a schema id to look up and %s is unavailable (%s: %s); "
                                    "it waits", self.config.name, record.topic, record.partition, record.offset,
                                    dependency, type(exc).__name__, exc)
                    rounds += 1
                    self.stats["outage_retries"] += 1
                    await asyncio.sleep(backoff(rounds, base_s=self.config.retry.backoff_s,
                                                cap_s=self.config.outage_backoff_s))
        finally:
            if outage is not None:
                self._release(tp, outage)

    def _defer(self, tp: TopicPartition, record: Record, value: bytes | None, deferred: Deferred) -> None:
        """Put ``record`` aside (its handler raised ``Deferred``): it stays in flight, not done, so no offset
        is committed past it, while its key's next records are handled; once ``deferred.ready`` resolves
        (or its timeout passed) it is scheduled again, behind whatever its key has queued by then. A
        revocation or shutdown cancels the wait: the partition's next owner gets the record again."""
        self.stats["deferred"] += 1
        log.info("%s: %s[%d]@%d put aside (%s)", self.config.name, record.topic, record.partition, record.offset,
                 deferred)

        async def later() -> None:
            if deferred.ready is not None:
                await asyncio.wait([deferred.ready], timeout=deferred.timeout_s)
            else:
                await asyncio.sleep(deferred.timeout_s)
            self._schedule(tp, replace(record, deferrals=record.deferrals + 1), value)

        waiting = self._deferred.setdefault(tp, set())
        task = asyncio.create_task(later())
        waiting.add(task)
        task.add_done_callback(waiting.discard)

    async def _cancel_deferred(self, tps: set[TopicPartition]) -> None:
        tasks = [t for tp in tps for t in self._deferred.pop(tp, ())]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _hold(self, tp: TopicPartition, dependency: str, exc: BaseException) -> Outage:
        """A record of ``tp`` starts waiting for ``dependency``: readiness reports it, the partition is held."""
        self._held[tp] = self._held.get(tp, 0) + 1
        return self.outages.begin(dependency, exc)

    def _release(self, tp: TopicPartition, outage: Outage) -> None:
        """That record waits no more (done, or dead-lettered)."""
        self.outages.end(outage)
        held = self._held.pop(tp, 1) - 1
        if held > 0:
            self._held[tp] = held

    async def _wait_out(self, dependency: str, rounds: int) -> bool:
        """Sleep one round of an outage (capped exponential backoff); then True when the dependency's
        probe answers — the failure was then the record's own, and counts as an attempt — else False."""
        policy = self.config.retry
        await asyncio.sleep(backoff(rounds, base_s=policy.backoff_s, cap_s=self.config.outage_backoff_s))
        probe = self.probes.get(dependency)
        if probe is None or rounds < 2:
            return False
        try:
            await asyncio.wait_for(probe(), self.config.outage_backoff_s)
        except Exception:
            return False
        return True

    async def _route(self, record: Record, value: bytes | None, event: Event) -> None:
        """Forward a record to its run's partition of the same topic, unchanged but for its key (the run id)
        and an ``agentstream-routed-from`` header (its producer used another partitioner, or another key);
        the copy there is handled by the partition's owner, with the run's other events. The record is done
        once the copy is acknowledged; a redelivered original is forwarded again, and the copy dropped as a
        duplicate by the run's owner (same event id; a task's run id starts its run once)."""
        partition = self.runtime.topics.partition_for(event.run_id)
        headers = [(k, v) for k, v in record.headers.items() if k != ROUTED_HEADER]
        headers.append((ROUTED_HEADER, f"{record.topic}:{record.partition}:{record.offset}".encode()))
        await (await self.runtime.producer.send(record.topic, value, key=event.run_id.encode(), partition=partition,
                                                headers=headers))
        self.stats["routed"] += 1
        log.info("%s: %s of %s arrived on %s[%d]@%d (key %r), forwarded to partition %d keyed by its run id",
                 self.config.name, type(event).__name__, event.run_id, record.topic, record.partition,
                 record.offset, record.key, partition)

    async def _dead_letter(self, record: Record, value: bytes | None, kind: DeadLetterKind, reason: str,
                           run_id: str | None = None) -> None:
        """Send the record to the dead-letter topic. The letter is built to fit (streams/runtime/dead_letters.py: a prefix of
        a value too large, with its size and digest) and its publish waits out a broker outage, so a big
        or poisonous record never stops the service."""
        if run_id is None:
            run_id = record.key.decode(errors="replace") if record.key else ""
        await publish_dead_letter(self.runtime, Rejected(
            run_id=run_id, step=f"dlq:{record.topic}:{record.partition}:{record.offset}",
            service=self.config.name, consumer=self.config.name, source_topic=record.topic,
            source_partition=record.partition, source_offset=record.offset, key=record.key, value=value,
            headers=record.headers, error_kind=kind, reason=reason))
        self.stats["dead_lettered"] += 1
        if self._metrics is not None:
            self._metrics.dead_letter(kind).inc()

    # -- commits and rebalances ----------------------------------------------------------------
    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.commit_interval_s)
            await self._commit()

    async def _commit(self, tps: set[TopicPartition] | None = None) -> None:
        assert self.consumer is not None
        assigned = self.consumer.assignment()
        offsets = self.tracker.committable(assigned if tps is None else tps & assigned)
        if not offsets:
            return
        try:
            committing = time.perf_counter()
            await self.consumer.commit(offsets)
            if self._stages is not None:
                self._stages.since(f"{self.config.name}.offset_commit", committing)
        except (CommitFailedError, KafkaError) as exc:
            # Retried on the next tick while the partitions stay assigned; if they move (a rebalance),
            # the next owner starts from the last committed offsets and drops what it has seen
            # (deterministic ids), so this loses nothing either way.
            self.tracker.uncommitted(offsets)
            log.warning("%s: commit failed (%s); retried on the next tick", self.config.name, exc)

    async def _drain(self, tps: set[TopicPartition], grace: float) -> None:
        tasks = {t for tp in tps for t in self._tasks.get(tp, ())}
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        if pending:
            log.warning("%s: %d in-flight records abandoned uncommitted (redelivered to the next owner)",
                        self.config.name, len(pending))
            await asyncio.wait(pending)

    async def _on_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._cancel_deferred(revoked)
        await self._drain(revoked, self.config.shutdown_grace_s)
        await self._commit(revoked)
        self.tracker.forget(revoked)
        self._paused -= revoked  # a partition that comes back starts unpaused
        if self._on_revoked_cb is not None:
            await self._on_revoked_cb(revoked)

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        if self._on_assigned_cb is not None:
            await self._on_assigned_cb(assigned)
        self._joined.set()


async def run_services(runners: Sequence[ServiceRunner], stop: asyncio.Event) -> None:
    """Run several services until ``stop`` is set, then stop them all gracefully."""
    tasks = [asyncio.create_task(r.run(), name=r.config.name) for r in runners]
    stopper = asyncio.create_task(stop.wait())
    await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    for runner in runners:
        runner.stop()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    stopper.cancel()
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


__all__ = ["Context", "Handler", "Record", "RetryPolicy", "Runtime", "ServiceConfig", "ServiceRunner",
           "is_retriable", "run_services"]
