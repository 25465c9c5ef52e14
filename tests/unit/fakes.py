"""An in-memory stand-in for the broker, for driving ``streams/runtime/runner.py`` without Kafka.

``FakeKafka`` holds partition logs, the group's committed offsets and what was produced. Its
``consumer`` and ``producer`` methods take the keyword arguments of ``AIOKafkaConsumer`` and
``AIOKafkaProducer`` (tests put them in their place in ``agentstream.streams.runtime.runner`` and
``agentstream.streams.runtime.publisher``) and return objects with the part of the aiokafka API the
runtime uses:

- ``FakeConsumer``: ``start``/``stop``, ``subscribe(topics, listener=)``, ``assignment()``,
  ``pause``/``resume``, ``getmany`` and ``commit``. The first ``getmany`` assigns every partition of
  the subscribed topics (``on_partitions_assigned``); ``rebalance(new)`` revokes all of them and
  assigns ``new``, eagerly, as aiokafka does: ``on_partitions_revoked`` is called while the old
  assignment is still current, and a partition (re)assigned is fetched from its committed offset, or
  from the start (``auto_offset_reset="earliest"``), unpaused. A paused partition returns nothing.
- ``FakeProducer``: ``send`` records the message and returns its acknowledgement, a future that is
  resolved at once, or left pending (``hold_acks``) until ``ack_all()``; ``send_error`` is raised from
  the next sends instead.

Every call that matters is recorded (``commits``, ``pauses``, ``resumes``, ``produced``) so tests
can assert exact histories.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import TopicPartition


class Listener(Protocol):
    """What the runtime passes to ``subscribe`` (its ``ConsumerRebalanceListener``)."""

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


@dataclass(frozen=True)
class Message:
    """What ``getmany`` returns (the fields of aiokafka's ``ConsumerRecord`` the runtime reads)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class Produced:
    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    headers: list[tuple[str, bytes]]
    ack: asyncio.Future = field(repr=False)


class FakeKafka:
    def __init__(self, partitions: int = 1) -> None:
        self.partitions = partitions
        self.logs: dict[TopicPartition, list[Message]] = {}
        self.committed: dict[TopicPartition, int] = {}
        #: Every ``commit`` call's offsets, in order.
        self.commits: list[dict[TopicPartition, int]] = []
        self.produced: list[Produced] = []
        self.consumers: list[FakeConsumer] = []
        #: Leave acknowledgements pending until ``ack_all()``.
        self.hold_acks = False
        #: Raised by ``send`` (every send while set).
        self.send_error: BaseException | None = None

    # -- the log ------------------------------------------------------------------------------
    def append(self, topic: str, partition: int, value: bytes | None, key: bytes | None = None,
               headers: tuple[tuple[str, bytes], ...] = ()) -> int:
        """Append a record; returns its offset."""
        log = self.logs.setdefault(TopicPartition(topic, partition), [])
        log.append(Message(topic, partition, len(log), key, value, int(time.time() * 1000), headers))
        return len(log) - 1

    def commits_for(self, tp: TopicPartition) -> list[int]:
        """The offsets committed for ``tp``, in order."""
        return [offsets[tp] for offsets in self.commits if tp in offsets]

    # -- clients ------------------------------------------------------------------------------
    def consumer(self, **config: Any) -> FakeConsumer:
        consumer = FakeConsumer(self, config)
        self.consumers.append(consumer)
        return consumer

    def producer(self, **config: Any) -> FakeProducer:
        return FakeProducer(self, config)

    def ack_all(self) -> None:
        for produced in self.produced:
            if not produced.ack.done():
                produced.ack.set_result(None)


class FakeConsumer:
    def __init__(self, kafka: FakeKafka, config: dict[str, Any]) -> None:
        self.kafka = kafka
        self.config = config
        self.started = self.stopped = False
        self.topics: list[str] = []
        self.listener: Listener | None = None
        self._assigned: set[TopicPartition] = set()
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._next_assignment: set[TopicPartition] | None = None
        self._rebalanced: asyncio.Event | None = None
        #: Every ``pause``/``resume`` call's partitions, in order.
        self.pauses: list[set[TopicPartition]] = []
        self.resumes: list[set[TopicPartition]] = []

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def subscribe(self, topics: list[str], listener: Listener | None = None) -> None:
        self.topics = list(topics)
        self.listener = listener
        self._next_assignment = {TopicPartition(t, p) for t in topics for p in range(self.kafka.partitions)}

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def pause(self, *tps: TopicPartition) -> None:
        self.pauses.append(set(tps))
        self._paused |= set(tps) & self._assigned

    def resume(self, *tps: TopicPartition) -> None:
        self.resumes.append(set(tps))
        self._paused -= set(tps)

    async def rebalance(self, assignment: set[TopicPartition]) -> None:
        """Revoke every partition, then assign ``assignment``; returns once both callbacks ran."""
        self._rebalanced = asyncio.Event()
        self._next_assignment = set(assignment)
        await self._rebalanced.wait()

    async def _apply_rebalance(self, new: set[TopicPartition]) -> None:
        if self._assigned and self.listener is not None:
            await self.listener.on_partitions_revoked(set(self._assigned))
        self._assigned = set(new)
        self._paused = set()  # a new assignment starts unpaused
        self._positions = {tp: self.kafka.committed.get(tp, 0) for tp in new}
        if self.listener is not None:
            await self.listener.on_partitions_assigned(set(new))
        if self._rebalanced is not None:
            self._rebalanced.set()
            self._rebalanced = None

    async def getmany(self, *, timeout_ms: int = 0, max_records: int | None = None,
                      ) -> dict[TopicPartition, list[Message]]:
        if self._next_assignment is not None:
            new, self._next_assignment = self._next_assignment, None
            await self._apply_rebalance(new)
        out: dict[TopicPartition, list[Message]] = {}
        budget = max_records if max_records is not None else 1 << 30
        for tp in sorted(self._assigned - self._paused):
            log = self.kafka.logs.get(tp, [])
            batch = log[self._positions[tp]:self._positions[tp] + budget]
            if batch:
                out[tp] = batch
                self._positions[tp] += len(batch)
                budget -= len(batch)
        if not out:
            # Nothing to fetch: wait a little, as a fetch would (kept short so tests run fast).
            await asyncio.sleep(min(timeout_ms, 1) / 1000)
        return out

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.kafka.commits.append(dict(offsets))
        self.kafka.committed.update(offsets)


class FakeProducer:
    def __init__(self, kafka: FakeKafka, config: dict[str, Any]) -> None:
        self.kafka = kafka
        self.config = config

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   partition: int | None = None, headers: list[tuple[str, bytes]] | None = None,
                   timestamp_ms: int | None = None) -> asyncio.Future:
        if self.kafka.send_error is not None:
            raise self.kafka.send_error
        ack: asyncio.Future = asyncio.get_running_loop().create_future()
        self.kafka.produced.append(Produced(topic, value, key, partition, list(headers or ()), ack))
        if not self.kafka.hold_acks:
            ack.set_result(None)
        return ack
