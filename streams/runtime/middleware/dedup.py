"""De-duplication: an event whose id this instance handled recently is dropped (a redelivery after a
rebalance or a restart of its producer; event ids are deterministic, so a copy has the original's id).

An id is remembered only once its record is done — handled and its outputs acknowledged — unless the
handler asked to ``forget`` it (``Context.forget``), and not for a record forwarded to its run's
partition (the copy there is still to come). A record that failed for good, or was refused, is not
remembered either: a re-driven copy (``agentstream dlq redrive``) is handled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import MutableMapping

from agentstream.streams.runtime.middleware.chain import Delivery, Next


class SeenEvents:
    """Event ids this instance finished recently, the ``capacity`` newest."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, event_id: str) -> bool:
        return event_id in self._seen

    def add(self, event_id: str) -> None:
        self._seen[event_id] = None
        if len(self._seen) > self.capacity:
            self._seen.popitem(last=False)


class Dedup:
    def __init__(self, seen: SeenEvents, stats: MutableMapping[str, int]) -> None:
        self.seen = seen
        self.stats = stats

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        event_id = delivery.event.event_id
        if event_id in self.seen:
            self.stats["duplicates"] += 1
            delivery.duplicate = True
            return
        await call_next(delivery)
        if delivery.done and not delivery.misrouted and delivery.remembered:
            self.seen.add(event_id)


__all__ = ["Dedup", "SeenEvents"]
