"""The live fan-out of one cell: one Kafka consumer for every open stream of the replica.

A stream per SSE connection, each with a consumer of its own, would cost a thousand consumers (fetch
loops, connections, memory) for a thousand streams. Instead each cell (a tenant's topics) has one ``Hub``:
a consumer without a group over every partition of the topics a run's stream follows (positions.py),
from their end when the hub starts. Every record it reads is decoded once, kept for a while
(``History``: a stream that starts or resumes later reads its run's past from there rather than from
Kafka), and handed to the subscriptions of its run, each a bounded queue. A subscriber that lets its
queue fill up is dropped, not waited for: a slow reader can never slow the others; it reconnects with
its last event id and loses nothing.

The handover between a stream's past and its live feed is exact: ``subscribe`` notes, without awaiting
anything, the position up to which the hub has dispatched (``Subscription.live_from``); every record at or
after it reaches the queue, every record before it is the past (History, or Kafka when History does not
reach back far enough).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.services.gateway.metrics import GatewayMetrics
from agentstream.services.gateway.positions import STREAM_TOPICS, TOKENS, Position
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import ClaimCheck, Event, RunCompleted, RunFailed
from agentstream.streams.kafka.claims import ClaimStore
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.consumer_stop import stop_consumer
from agentstream.streams.kafka.topics import Topics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Item:
    """One record of a run's stream: which of ``STREAM_TOPICS`` (``topic``), its offset and timestamp
    (milliseconds, the producer's), and the event. ``rendered``: its SSE data, made once for all the
    streams that show it (services/gateway/sse.py)."""

    topic: int
    offset: int
    timestamp_ms: int
    event: Event
    rendered: dict[str, object] = field(default_factory=dict, compare=False, repr=False)
    #: When the hub had it (monotonic): a lookup of the partition's end begun later covers it.
    received: float = field(default=0.0, compare=False, repr=False)


class Subscription:
    """A stream's share of the hub: the run's records from ``live_from`` on, in a bounded queue."""

    def __init__(self, run_id: str, partition: int, live_from: Position, size: int) -> None:
        self.run_id = run_id
        self.partition = partition
        self.live_from = live_from
        self.queue: asyncio.Queue[Item] = asyncio.Queue(size)
        #: Set when the queue overflowed: the stream ends once it has read what the queue holds.
        self.dropped = False

    def offer(self, item: Item) -> bool:
        try:
            self.queue.put_nowait(item)
            return True
        except asyncio.QueueFull:
            self.dropped = True
            return False


@dataclass
class RunHistory:
    """The records of one run the hub has read since ``complete_from`` (all of them)."""

    complete_from: Position
    items: list[Item] = field(default_factory=list)
    last_seen: float = 0.0


class History:
    """Recent records per run, bounded by count and age. A run dropped from it is remembered as dropped
    (``forgotten``) so that it is never mistaken for a run without records."""

    def __init__(self, max_events: int, max_age_s: float) -> None:
        self.max_events = max_events
        self.max_age_s = max_age_s
        self.runs: OrderedDict[str, RunHistory] = OrderedDict()  # least recently active first
        self.count = 0
        self.forgotten: OrderedDict[str, None] = OrderedDict()
        #: When a run was last dropped from ``forgotten`` itself (monotonic); runs older than that are unknown.
        self.lost_track_at: float | None = None

    def add(self, run_id: str, item: Item, complete_from: Position, now: float) -> None:
        entry = self.runs.get(run_id)
        if entry is None:
            if run_id in self.forgotten:
                return  # its earlier records are gone: keeping the rest would look complete
            entry = self.runs[run_id] = RunHistory(complete_from)
        else:
            self.runs.move_to_end(run_id)
        entry.items.append(item)
        entry.last_seen = now
        self.count += 1
        if self.count > self.max_events:
            self._trim(int(self.max_events * 0.9), now)

    def sweep(self, now: float) -> None:
        while self.runs:
            run_id, entry = next(iter(self.runs.items()))
            if now - entry.last_seen <= self.max_age_s:
                break
            self._forget(run_id, now)

    def _trim(self, target: int, now: float) -> None:
        while self.runs and self.count > target:
            self._forget(next(iter(self.runs)), now)

    def _forget(self, run_id: str, now: float) -> None:
        entry = self.runs.pop(run_id)
        self.count -= len(entry.items)
        self.forgotten[run_id] = None
        if len(self.forgotten) > 100_000:
            self.forgotten.popitem(last=False)
            self.lost_track_at = now


class Hub:
    """The live records of one cell's runs, for every stream of this replica (see the module docstring)."""

    def __init__(self, settings: Settings, codec: Codec, *, queue_size: int, history_events: int,
                 history_s: float, claims: Callable[[], Awaitable[ClaimStore]] | None = None,
                 metrics: GatewayMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        #: Where a claim-checked event's body is read back (the cell's PostgreSQL), when a stream meets one.
        self.claims = claims
        self.topics = Topics.of(settings)
        self.codec = codec
        self.queue_size = queue_size
        self.names = [getattr(self.topics, name) for name in STREAM_TOPICS]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.consumer = AIOKafkaConsumer(**settings.kafka_options(), enable_auto_commit=False,
                                         isolation_level="read_committed", fetch_max_wait_ms=50,
                                         request_timeout_ms=settings.kafka_request_timeout_ms)
        #: Offsets are looked up with a consumer of their own: asked of ``consumer``, a lookup waits behind
        #: its fetch in flight (up to ``fetch_max_wait_ms``), on every stream's last event.
        self.offsets = AIOKafkaConsumer(**settings.kafka_options(), enable_auto_commit=False,
                                        isolation_level="read_committed",
                                        request_timeout_ms=settings.kafka_request_timeout_ms)
        self.history = History(history_events, history_s)
        self.subs: dict[str, list[Subscription]] = {}
        #: Per partition: where the hub started, and the next offset it dispatches, per topic.
        self.started: dict[int, Position] = {}
        self.next: dict[int, list[int]] = {}
        self.started_wall = 0.0
        self.dropped_streams = 0
        self._advanced = asyncio.Event()
        self._dispatching = False  # a fetched batch is being handed out (its records are not all out yet)
        self._ends: dict[int, tuple[float, asyncio.Future[Position]]] = {}  # the latest end lookup per partition
        self._task: asyncio.Task[None] | None = None

    def tp(self, topic: int, partition: int) -> TopicPartition:
        return TopicPartition(self.names[topic], partition)

    def partition_tps(self, partition: int) -> list[TopicPartition]:
        return [self.tp(i, partition) for i in range(len(self.names))]

    async def start(self) -> None:
        await self.offsets.start()
        await self.consumer.start()
        tps = [tp for p in range(self.settings.partitions) for tp in self.partition_tps(p)]
        self.consumer.assign(tps)
        ends = await self.offsets.end_offsets(tps)  # (also: its metadata is fetched now, not on a stream's end)
        for tp in tps:
            self.consumer.seek(tp, ends[tp])
        for p in range(self.settings.partitions):
            offsets = [ends[self.tp(i, p)] for i in range(len(self.names))]
            self.started[p] = Position(p, tuple(offsets))
            self.next[p] = list(offsets)
        self.started_wall = time.time()
        self._task = asyncio.create_task(self._loop(), name=f"gateway hub {self.topics.prefix or '(default)'}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await stop_consumer(self.consumer, "gateway hub")
        await stop_consumer(self.offsets, "gateway hub offsets")

    # -- subscriptions ---------------------------------------------------------------------------
    def position(self, partition: int) -> Position:
        """Up to where the hub has dispatched ``partition``'s records (the next offsets)."""
        return Position(partition, tuple(self.next[partition]))

    def subscribe(self, run_id: str, partition: int) -> Subscription:
        """From now on, ``run_id``'s records at or after ``live_from`` go to the subscription's queue.
        Synchronous on purpose: nothing is dispatched between reading the position and registering."""
        sub = Subscription(run_id, partition, self.position(partition), self.queue_size)
        self.subs.setdefault(run_id, []).append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self.subs.get(sub.run_id)
        if subs and sub in subs:
            subs.remove(sub)
            if not subs:
                del self.subs[sub.run_id]

    def past(self, run_id: str, start: Position, until: Position, *, submitted_wall: float | None) -> list[Item] | None:
        """The run's records in ``[start, until)`` from History, in the hub's order; None when History
        cannot say (records before it began, or forgotten): read them from Kafka then."""
        entry = self.history.runs.get(run_id)
        if entry is None:
            known = (run_id not in self.history.forgotten and start.at_least(self.started[start.partition])
                     and self.history.lost_track_at is None)
            # No record of the run since the hub started: none exist, if it began after the hub did.
            began_after = submitted_wall is not None and submitted_wall > self.started_wall + 1.0
            return [] if known and began_after else None
        if not start.at_least(entry.complete_from):
            return None
        return [i for i in entry.items if not start.covers(i.topic, i.offset) and until.covers(i.topic, i.offset)]

    # -- reading ---------------------------------------------------------------------------------
    async def end_position(self, partition: int, *, after: float | None = None) -> Position:
        """Where ``partition``'s topics end now (the last stable offsets). With ``after`` (a monotonic
        time), any lookup begun at or after it will do: the streams of a run end together, on its outcome,
        and share one request instead of sending one each."""
        shared = self._ends.get(partition)
        if after is not None and shared is not None and shared[0] >= after:
            return await asyncio.shield(shared[1])
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        entry = self._ends[partition] = (time.monotonic(), future)
        tps = self.partition_tps(partition)
        try:
            ends = await self.offsets.end_offsets(tps)
        except BaseException as exc:
            if self._ends.get(partition) is entry:
                del self._ends[partition]
            future.set_exception(exc)
            future.exception()  # retrieved: whoever shares it gets it raised
            raise
        position = Position(partition, tuple(ends[tp] for tp in tps))
        future.set_result(position)
        return position

    async def reached(self, target: Position) -> None:
        """Return once the hub has read ``target``'s partition up to ``target`` in every topic."""
        while True:
            done = not self._dispatching  # the consumer's position runs ahead of a batch being handed out
            for i in range(len(self.names) if done else 0):
                if target.offsets[i] > self.next[target.partition][i] and \
                        await self.consumer.position(self.tp(i, target.partition)) < target.offsets[i]:
                    done = False
                    break
            if done:
                return
            self._advanced.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._advanced.wait(), 0.5)

    async def _loop(self) -> None:
        last_sweep = time.monotonic()
        while True:
            try:
                # Short: a stream draining its run's end waits for the next round (the consumer's position
                # also moves past transaction markers, which hand out no record).
                batch = await self.consumer.getmany(timeout_ms=10, max_records=2000)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("gateway hub: fetching failed; retrying")
                await asyncio.sleep(1.0)
                continue
            now = time.monotonic()
            self._dispatching = True
            try:
                for tp, messages in batch.items():
                    topic = self.index[tp.topic]
                    for msg in messages:
                        try:
                            event = await self.codec.decode_async(msg.value)
                        except DecodeError:
                            event = None
                        self._dispatch(topic, tp.partition, msg.offset, msg.timestamp, event, now)
            finally:
                self._dispatching = False
            self._advanced.set()
            if now - last_sweep > 5.0:
                last_sweep = now
                self.history.sweep(now)

    def _dispatch(self, topic: int, partition: int, offset: int, timestamp_ms: int, event: Event | None,
                  now: float) -> None:
        """Synchronous: record, remember and hand out one record (see ``subscribe``)."""
        self.next[partition][topic] = max(self.next[partition][topic], offset + 1)
        if event is None:
            return
        item = Item(topic, offset, timestamp_ms, event, received=now)
        if topic == TOKENS and self.metrics is not None:
            self.metrics.hub_lag.observe(max(0.0, time.time() - timestamp_ms / 1000))
        self.history.add(event.run_id, item, self.started[partition], now)
        for sub in self.subs.get(event.run_id, ()):
            if not sub.dropped and not sub.offer(item):
                self.dropped_streams += 1
                if self.metrics is not None:
                    self.metrics.dropped.inc()
                log.info("gateway: a stream of %s fell %d events behind and was dropped", event.run_id,
                         self.queue_size)


def is_outcome(event: Event) -> bool:
    """A run's outcome, or a claim check standing for one (its body could not be read back)."""
    return isinstance(event, (RunCompleted, RunFailed)) or (
        isinstance(event, ClaimCheck) and event.event_type in (RunCompleted.schema_name, RunFailed.schema_name))


__all__ = ["History", "Hub", "Item", "RunHistory", "Subscription", "is_outcome"]
