"""A run's events as a client streams them: its past from a position, then its live records, then its end.

``RunStream`` joins the cell's ``Hub`` (the live feed), reads what came before from the hub's History (or
from Kafka, with a consumer of its own, when History does not reach back that far), and yields each of the
run's records once, in order per topic, with the position after it. When the run's outcome arrives it is
held back until every topic of the run's partition has been read to where it ended at that moment (the
run's last tokens were acknowledged before its outcome was published), so the outcome is the last event
and nothing of the run comes after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from aiokafka import AIOKafkaConsumer

from agentstream.services.gateway.hub import Hub, Item, Subscription, is_outcome
from agentstream.services.gateway.positions import Position
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import ClaimCheck

log = logging.getLogger(__name__)


class SlowReader(Exception):
    """The client read too slowly and its queue overflowed: the stream ends; it resumes from its last id."""


@dataclass(frozen=True)
class Emitted:
    """One of the run's records and the position just after it (the SSE id)."""

    item: Item
    position: Position


@dataclass(frozen=True)
class Idle:
    """Nothing for ``keepalive_s``: a chance to write a comment line so proxies keep the stream open."""


class RunStream:
    """One client's stream of one run (see the module docstring). Use as an async context manager (it
    subscribes at entry, so the live feed is never missed) and iterate ``events()``."""

    def __init__(self, hub: Hub, run_id: str, *, start: Position | None, submitted_wall: float | None,
                 terminal: bool, keepalive_s: float) -> None:
        self.hub = hub
        self.run_id = run_id
        self.partition = hub.topics.partition_for(run_id)
        self.start = start
        self.submitted_wall = submitted_wall
        self.terminal = terminal
        self.keepalive_s = keepalive_s
        self.sub: Subscription | None = None

    async def __aenter__(self) -> RunStream:
        self.sub = self.hub.subscribe(self.run_id, self.partition)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.sub is not None:
            self.hub.unsubscribe(self.sub)

    async def beginning(self) -> Position:
        """Where the run's records begin: where the hub started, if the run was submitted after that;
        else the offsets at the run's submission time (a second early, for clocks apart)."""
        started = self.hub.started[self.partition]
        if self.submitted_wall is not None and self.submitted_wall > self.hub.started_wall + 1.0:
            return started
        tps = self.hub.partition_tps(self.partition)
        if self.submitted_wall is None:
            return started
        found = await self.hub.offsets.offsets_for_times({tp: int((self.submitted_wall - 1.0) * 1000) for tp in tps})
        ends = await self.hub.offsets.end_offsets(tps)
        offsets = []
        for tp in tps:
            at = found.get(tp)
            offsets.append(ends[tp] if at is None else at.offset)
        return Position(self.partition, tuple(offsets))

    async def events(self, *, drain: bool = True) -> AsyncIterator[Emitted | Idle]:
        """The run's events (see the module docstring). ``drain=False``: the outcome as soon as it comes,
        not held until the rest of the run's records are read (for a caller that wants only the outcome)."""
        assert self.sub is not None, "use RunStream as an async context manager"
        sub = self.sub
        start = self.start or await self.beginning()
        pos = start
        finish: Position | None = await self.hub.end_position(self.partition) if self.terminal else None
        outcome: Item | None = None
        seen: set[tuple[str, int]] = set()  # a regenerated step repeats its chunks: (step, seq)
        past = self.hub.past(self.run_id, start, sub.live_from, submitted_wall=self.submitted_wall)
        if past is None:
            past = await self._from_kafka(start, sub.live_from)

        def accept(item: Item) -> bool:
            nonlocal pos
            if pos.covers(item.topic, item.offset):
                return False  # before where this stream began, or already sent
            pos = pos.after(item.topic, item.offset)
            key = _chunk_key(item)
            if key is not None:
                if key in seen:
                    return False
                seen.add(key)
            return True

        for item in past:
            item = await self._redeemed(item)
            if is_outcome(item.event):
                outcome = outcome or item
                pos = pos.after(item.topic, item.offset)
                continue
            if accept(item):
                yield Emitted(item, pos)
        reached: asyncio.Task[None] | None = None
        try:
            while True:
                if outcome is not None and not drain:
                    yield Emitted(outcome, pos)
                    return
                if outcome is not None and finish is None:
                    finish = await self.hub.end_position(self.partition, after=outcome.received)
                if finish is not None and reached is None:
                    reached = asyncio.create_task(self.hub.reached(finish.merge(pos)))
                if reached is not None and reached.done() and sub.queue.empty():
                    reached.result()
                    if outcome is not None:
                        yield Emitted(outcome, pos)
                    return
                if sub.dropped and sub.queue.empty():
                    raise SlowReader(f"the stream of {self.run_id} fell behind and was dropped")
                if reached is not None:  # draining: what the queue holds, until the hub has read far enough
                    if sub.queue.empty():
                        await asyncio.wait([reached], timeout=0.05)
                        continue
                    item = sub.queue.get_nowait()
                else:
                    if sub.queue.empty():
                        try:
                            async with asyncio.timeout(self.keepalive_s):  # (a timer, not a task per wait)
                                item = await sub.queue.get()
                        except TimeoutError:
                            yield Idle()
                            continue
                    else:
                        item = sub.queue.get_nowait()
                item = await self._redeemed(item)
                if is_outcome(item.event):
                    if not pos.covers(item.topic, item.offset):
                        outcome = outcome or item
                        pos = pos.after(item.topic, item.offset)
                    continue
                if accept(item):
                    yield Emitted(item, pos)
        finally:
            if reached is not None and not reached.done():
                reached.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reached

    async def _redeemed(self, item: Item) -> Item:
        """A claim check (an event over a Kafka record's size, kept in PostgreSQL) as the event it stands for."""
        if not isinstance(item.event, ClaimCheck) or self.hub.claims is None:
            return item
        try:
            body = await (await self.hub.claims()).redeem(item.event)
            return replace(item, event=await self.hub.codec.decode_async(body), rendered={})
        except Exception as exc:  # gone, or the database is away: the stream goes on without it
            log.warning("gateway: %s's %s could not be read back (%s)", self.run_id, item.event.event_type, exc)
            return item

    async def _from_kafka(self, start: Position, until: Position) -> list[Item]:
        """The run's records in ``[start, until)``, read with a consumer of this stream's own, merged
        across topics by timestamp (each topic kept in offset order)."""
        hub = self.hub
        tps = [tp for i, tp in enumerate(hub.partition_tps(self.partition)) if start.offsets[i] < until.offsets[i]]
        if not tps:
            return []
        consumer = AIOKafkaConsumer(**hub.settings.kafka_options(), enable_auto_commit=False,
                                    isolation_level="read_committed", fetch_max_wait_ms=50)
        await consumer.start()
        per_topic: list[list[Item]] = [[] for _ in hub.names]
        key = self.run_id.encode()
        try:
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, start.offsets[hub.index[tp.topic]])
            left = set(tps)
            while left:
                batch = await consumer.getmany(*left, timeout_ms=200)
                for tp, messages in batch.items():
                    topic = hub.index[tp.topic]
                    for msg in messages:
                        if msg.offset >= until.offsets[topic] or msg.key != key:
                            continue
                        try:
                            event = await hub.codec.decode_async(msg.value)
                        except DecodeError:
                            continue
                        if event.run_id == self.run_id:
                            per_topic[topic].append(Item(topic, msg.offset, msg.timestamp, event,
                                                         received=time.monotonic()))
                for tp in list(left):
                    if await consumer.position(tp) >= until.offsets[hub.index[tp.topic]]:
                        left.discard(tp)
        finally:
            await consumer.stop()
        return list(heapq.merge(*per_topic, key=lambda i: (i.timestamp_ms, i.topic, i.offset)))


def _chunk_key(item: Item) -> tuple[str, int] | None:
    seq = getattr(item.event, "seq", None)
    return (item.event.step_id, seq) if isinstance(seq, int) else None


__all__ = ["Emitted", "Idle", "RunStream", "SlowReader"]
