"""Which offsets may be committed when records of a partition finish out of order.

Records are handled concurrently (different runs in parallel), so record 7 may finish before record 5.
Committing 8 then would skip 5 if the process died. Per partition we keep the offsets in fetch order
and commit one past the highest offset below which *every* record is done.
"""

from __future__ import annotations

from collections import deque

from aiokafka import TopicPartition


class _Partition:
    __slots__ = ("committed", "done", "order", "reached")

    def __init__(self) -> None:
        self.order: deque[int] = deque()
        self.done: set[int] = set()
        self.reached: int | None = None  # one past the highest contiguous done offset so far
        self.committed: int | None = None  # last position handed out by committable() and not failed

    def position(self) -> int | None:
        """One past the highest contiguous done offset (None if nothing finished since the last call)."""
        last = None
        while self.order and self.order[0] in self.done:
            last = self.order.popleft()
            self.done.discard(last)
        return None if last is None else last + 1


class OffsetTracker:
    def __init__(self) -> None:
        self._parts: dict[TopicPartition, _Partition] = {}
        self._in_flight = 0

    def started(self, tp: TopicPartition, offset: int) -> None:
        self._parts.setdefault(tp, _Partition()).order.append(offset)
        self._in_flight += 1

    def done(self, tp: TopicPartition, offset: int) -> None:
        part = self._parts.get(tp)
        if part is None:  # the partition was revoked and forgotten meanwhile
            return
        part.done.add(offset)
        self._in_flight -= 1

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def in_flight_for(self, tps: set[TopicPartition]) -> int:
        return sum(len(p.order) - len(p.done) for tp, p in self._parts.items() if tp in tps)

    def committable(self, tps: set[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """Positions to commit now (only partitions that advanced), as an explicit offsets map."""
        out: dict[TopicPartition, int] = {}
        for tp, part in self._parts.items():
            if tps is not None and tp not in tps:
                continue
            position = part.position()
            if position is not None:
                part.reached = position
            if part.reached is not None and part.reached != part.committed:
                part.committed = part.reached
                out[tp] = part.reached
        return out

    def uncommitted(self, offsets: dict[TopicPartition, int]) -> None:
        """A commit of ``offsets`` failed: hand those positions out again on the next ``committable``
        (a transient coordinator error must not leave finished records to be redone after a restart)."""
        for tp, position in offsets.items():
            part = self._parts.get(tp)
            if part is not None and part.committed == position:
                part.committed = None

    def forget(self, tps: set[TopicPartition]) -> None:
        """Drop revoked partitions: their unfinished records will be redelivered to the new owner."""
        for tp in tps:
            part = self._parts.pop(tp, None)
            if part is not None:
                self._in_flight -= len(part.order) - len(part.done)
