"""Fencing: Kafka assigns partitions, PostgreSQL decides who may act on them.

When a partition is assigned, the planner takes a lease on it (a new epoch in ``planner_leases``); every
transition carries the epoch and is refused once another planner holds a newer one (a planner paused past
its session timeout, or cut off from the broker, writes nothing over its successor's work), and a planner
that notices it was paused re-checks its leases before publishing anything. A run's cached state is kept
across a rebalance only when the lease's epoch shows nobody else held the partition meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka import TopicPartition

from agentstream.services.planner.cache import RunCache
from agentstream.services.planner.state import RunState
from agentstream.streams.core.ids import default_instance
from agentstream.streams.core.outages import wait_out
from agentstream.streams.core.signals import Fenced
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.store.history import Lease, TransitionStore

log = logging.getLogger(__name__)


class Leases:
    """The planner's leases on its partitions of the tasks topic, and the take-over that follows an
    assignment. ``stats["fenced"]`` counts the transitions and publications refused by a newer lease."""

    def __init__(self, store: TransitionStore, topics: Topics, cache: RunCache, stats: dict[str, int], *,
                 session_timeout_s: float, on_loaded: Callable[[RunState], None] | None = None) -> None:
        self.store = store
        #: Told of every active run of a partition taken over (the sessions' queued turns).
        self.on_loaded = on_loaded
        self.topics = topics
        self.cache = cache
        self.stats = stats
        #: The partitions of the tasks topic Kafka assigned to this planner.
        self.assigned: set[int] = set()
        #: Partition number -> its lease (resolved once PostgreSQL granted it).
        self.held: dict[int, asyncio.Future[Lease]] = {}
        #: The epoch each partition had when this planner last held it (to tell whether its cache is stale).
        self._epochs: dict[int, int] = {}
        #: Leases to re-check before publishing: this process stalled long enough to lose its membership.
        self._suspect: set[int] = set()
        self._last_tick = time.monotonic()
        self._stall_s = max(0.5, min(2.0, session_timeout_s / 3))
        self._taking_over: asyncio.Task[None] | None = None

    def granted(self) -> set[int]:
        """The partitions whose lease PostgreSQL has granted (and that were not revoked meanwhile)."""
        return {p for p, lease in self.held.items() if lease.done() and not lease.cancelled()}

    async def lease(self, run_id: str) -> Lease:
        """This planner's lease on the run's partition, once PostgreSQL granted it; ``Fenced`` when the
        partition is not (or no longer) this planner's."""
        partition = self.topics.partition_for(run_id)
        lease = self.held.get(partition)
        if lease is None:
            raise Fenced(f"partition {partition} (run {run_id}) is not assigned to this planner")
        try:
            return await asyncio.shield(lease)
        except asyncio.CancelledError:
            if lease.cancelled():  # revoked while waiting for it
                raise Fenced(f"partition {partition} was revoked before its lease was granted") from None
            raise

    async def check(self, run_id: str) -> None:
        """Before publishing: the lease is held and, if this process stalled long enough to have lost
        its group membership meanwhile, still current in PostgreSQL."""
        lease = await self.lease(run_id)
        now = time.monotonic()
        if now - self._last_tick > self._stall_s:
            self._suspect.update(self.held)  # the timer has not run since the stall (or is not running)
            self._last_tick = now
        if lease.partition in self._suspect:
            if not await self.store.lease_is_current(lease):
                self.stats["fenced"] += 1
                self.lose(lease.partition)
                raise Fenced(f"partition {lease.partition} was taken over while this planner was stalled")
            self._suspect.discard(lease.partition)

    def ticked(self, now: float, slack: float) -> None:
        """The deadline timer ran at ``now`` (``time.monotonic``), ``slack`` seconds after it meant to at
        most: a longer gap since its last tick means the process stalled, and every lease is re-checked
        before this planner publishes again."""
        if now - self._last_tick > self._stall_s + slack:
            log.warning("planner: the process stalled for %.1f s; leases are re-checked before publishing",
                        now - self._last_tick)
            self._suspect.update(self.held)
        self._last_tick = now

    def lose(self, partition: int) -> None:
        """Forget a partition another planner took over (its revocation will follow)."""
        lease = self.held.pop(partition, None)
        if lease is not None and not lease.done():
            lease.cancel()
        self._forget_cached(lambda p: p == partition)

    def _forget_cached(self, which: Callable[[int], bool]) -> None:
        partition_for = self.topics.partition_for
        self.cache.forget(lambda run_id: which(partition_for(run_id)))

    # -- rebalances ---------------------------------------------------------------------------------
    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.assigned = {tp.partition for tp in assigned if tp.topic == self.topics.tasks}
        loop = asyncio.get_running_loop()
        new = {p: loop.create_future() for p in self.assigned if p not in self.held}
        self.held.update(new)
        self._forget_cached(lambda p: p not in self.assigned)
        if new:
            self._taking_over = asyncio.create_task(self._take_over(new), name="planner-take-over")

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """The runtime has drained the partitions' records: give their leases up (the cache stays, in
        case the partition comes straight back; ``_take_over`` decides)."""
        if self._taking_over is not None:
            self._taking_over.cancel()
        for partition in {tp.partition for tp in revoked if tp.topic == self.topics.tasks}:
            lease = self.held.pop(partition, None)
            if lease is not None and not lease.done():
                lease.cancel()
            self.assigned.discard(partition)

    async def _take_over(self, leases: dict[int, asyncio.Future[Lease]]) -> None:
        """Lease the partitions (retrying through a database outage), then load their active runs, so
        their deadlines are watched at once. A cached run survives only if this planner held its
        partition right before (the epoch moved by one)."""
        while True:
            try:
                await self._lease_and_load(leases)
                return
            except Exception:
                log.exception("planner: taking partitions %s over failed; trying again", sorted(leases))
                await asyncio.sleep(1.0)

    async def _lease_and_load(self, leases: dict[int, asyncio.Future[Lease]]) -> None:
        topics = self.topics
        fresh: dict[int, Lease] = {}
        for partition in sorted(leases):
            async def acquire(p: int = partition) -> Lease:
                return await self.store.acquire_lease(topics.prefix, p, default_instance())

            lease = await wait_out(acquire, f"leasing partition {partition}")
            if self._epochs.get(partition) != lease.epoch - 1:
                self._forget_cached(partition.__eq__)
            self._epochs[partition] = lease.epoch
            fresh[partition] = lease
        states = await wait_out(lambda: self.store.active_states(topics.prefix), "loading active runs")
        for raw in states:
            state = RunState.from_json(raw)
            if topics.partition_for(state.run_id) in fresh:
                if state.run_id not in self.cache:
                    self.cache.remember(state)
                if self.on_loaded is not None:
                    self.on_loaded(state)
        for partition, lease in fresh.items():
            if not leases[partition].done():  # (cancelled: revoked meanwhile)
                leases[partition].set_result(lease)
