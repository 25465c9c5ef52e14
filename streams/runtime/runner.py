"""The consumer loop every service runs on: fetch → schedule by key → the middleware chain → commit.

Guarantees (see docs/architecture.md):

- at-least-once: a record counts as done only after its handler returned, everything it emitted was
  acknowledged by the broker (``acks=all``, idempotent producer) and its database writes committed
  (handlers commit before returning); offsets are committed only up to the highest *contiguous* done
  record of each partition (``offsets.py``);
- records with the same key (a run) are handled one after another, others in parallel, at most
  ``concurrency`` at a time; past ``max_in_flight`` records the runtime pauses fetching;
- a record that cannot be decoded or is invalid, or whose handler fails for good, goes to the
  dead-letter topic with the reason, and the service carries on; so does an event its topic does not
  carry (``streams/kafka/channels.py``); an outage is waited out, with the record's partition paused
  (``middleware/retry.py``, ``middleware/decode.py``);
- partitions are assigned by number and stickily (``streams/kafka/assignor.py``): a member owns partition
  ``p`` of every topic it reads, so a service that joins topics by run (the planner) sees all of a
  run's events; with ``route_by_run`` an event off its run's partition is forwarded there
  (``middleware/routing.py``);
- a handler may put a record aside (``Deferred``: what it answers is still to be redone from another
  record); it stays uncommitted while its key's next records go on, and is handed over again later;
- an event too large for a record travels as a claim check (``streams/kafka/claims.py``), transparently;
- on shutdown or revocation, in-flight records get ``shutdown_grace_s`` to finish; the rest are
  cancelled uncommitted (the next owner redoes them), done offsets are committed, the group is left.

What happens to one record — decoding, de-duplication, tracing, metrics, retries, dead letters — is the
chain of small middlewares in ``middleware/`` (its ``__init__`` lists them); this module only feeds it.
Telemetry and the benchmark's stage timing are middlewares installed when the ``Runtime`` has them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from agentstream.streams.core.outages import Outages
from agentstream.streams.core.signals import Abandoned, Deferred
from agentstream.streams.kafka.assignor import copartitioned
from agentstream.streams.kafka.consumer_stop import stop_consumer
from agentstream.streams.runtime.failures import PartitionHolds, Rejector
from agentstream.streams.runtime.middleware.chain import Delivery, Middleware, Next, compose
from agentstream.streams.runtime.middleware.decode import Decode, Refuse
from agentstream.streams.runtime.middleware.dedup import Dedup, SeenEvents
from agentstream.streams.runtime.middleware.metrics import AttemptMetrics, RecordMetrics
from agentstream.streams.runtime.middleware.publish import CallHandler, Publish
from agentstream.streams.runtime.middleware.retry import Recover
from agentstream.streams.runtime.middleware.routing import Forward, RouteByRun
from agentstream.streams.runtime.middleware.stages import StageTiming
from agentstream.streams.runtime.middleware.tracing import RecordTracing
from agentstream.streams.runtime.offsets import OffsetTracker
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Handler, Probe, Record, ServiceConfig

log = logging.getLogger(__name__)


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
        #: Event ids handled recently (a redelivery after a rebalance is dropped).
        self.dedup = SeenEvents(config.dedup_capacity)
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
        #: How to tell whether a dependency answers (``database``: a trivial query), by name.
        self.probes: dict[str, Probe] = dict(probes or {})
        #: Dependencies being waited out now, and the partitions their records hold.
        self.holds = PartitionHolds(config, self.probes)
        #: The partitions this runner paused (others may pause more: a test, an operator).
        self._paused: set[TopicPartition] = set()
        self._failure: BaseException | None = None
        self._metrics = (runtime.metrics.service(config.name, lambda: self.tracker.in_flight)
                         if runtime.metrics else None)
        self._chain = self._compose()

    def _compose(self) -> Next:
        """The middlewares a record goes through (``middleware/__init__.py``), outermost first; the
        optional ones only when this process has what they record into."""
        cfg, runtime, metrics, stats = self.config, self.runtime, self._metrics, self.stats
        name = cfg.name
        reject = Rejector(runtime, name, stats, metrics, cfg.on_rejected)
        timing = StageTiming(runtime.stages, name) if runtime.stages is not None else None
        chain: list[Middleware | None] = [
            timing.record if timing else None,
            RecordMetrics(metrics) if metrics else None,
            Decode(name, runtime, self.holds, reject, stats),
            timing.decoded if timing else None,
            Refuse(name, runtime.topics, reject),
            Dedup(self.dedup, stats),
            RouteByRun(runtime) if cfg.route_by_run else None,
            RecordTracing(runtime.tracing, name) if runtime.tracing else None,
            Recover(name, cfg.retry, self.holds, reject, stats, metrics),
            # each attempt:
            AttemptMetrics(metrics) if metrics else None,
            Forward(name, runtime, stats) if cfg.route_by_run else None,
            timing.acked if timing else None,
            Publish(name, runtime, metrics),
            timing.handled if timing else None,
        ]
        return compose([m for m in chain if m is not None], CallHandler(runtime, self.handler))

    @property
    def outages(self) -> Outages:
        """Dependencies being waited out now (readiness reports them)."""
        return self.holds.outages

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
        wanted = set(assigned) if backlogged else {tp for tp in self.holds.held if tp in assigned}
        if wanted != self._paused:
            if wanted - self._paused:
                self.consumer.pause(*(wanted - self._paused))
            gone = (self._paused - wanted) & assigned
            if gone:
                self.consumer.resume(*gone)
            self._paused = wanted

    def _schedule(self, tp: TopicPartition, record: Record, value: bytes | None) -> None:
        key = record.key if record.key is not None else f"{tp}:{record.offset}".encode()
        # A record also follows the earlier records of the service's other keys for it (``order_keys``).
        keys = [key, *self.config.order_keys(record)] if self.config.order_keys is not None else [key]
        previous = [t for t in (self._tails.get(k) for k in keys) if t is not None]
        task = asyncio.create_task(self._process(previous, tp, record, value))
        for k in keys:
            self._tails[k] = task
        self._tasks.setdefault(tp, set()).add(task)

        def _cleanup(t: asyncio.Task[None], keys: list[bytes] = keys, tp: TopicPartition = tp) -> None:
            for k in keys:
                if self._tails.get(k) is t:
                    del self._tails[k]
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
    async def _process(self, previous: list[asyncio.Task[None]], tp: TopicPartition, record: Record,
                       value: bytes | None) -> None:
        if previous:
            await asyncio.wait(previous)  # same key: in order; their failure is not ours
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
        """Send one record through the chain: it returns once the record is handled, dropped or
        dead-lettered, and raises when it is none of them (``Deferred``, ``Abandoned``, the DLQ gone)."""
        started = time.perf_counter()
        await self._chain(Delivery(tp=tp, record=record, value=value, started=started,
                                   queue_wait=time.time() - record.timestamp_ms / 1000))

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
            if self.runtime.stages is not None:
                self.runtime.stages.since(f"{self.config.name}.offset_commit", committing)
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


__all__ = ["ServiceRunner", "run_services"]
