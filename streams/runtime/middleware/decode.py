"""From bytes to an event the service may handle.

``Decode``: a record that cannot become a valid event is dead-lettered (``undecodable``, ``invalid``…:
the ``DecodeError``'s kind). A schema id this process does not know is looked up in the schemas topic
(``Codec.decode_async``, ``streams/kafka/schema_log.py``); while that topic cannot be read (the broker is
away) the record waits, its partition held, as in an outage.

``Refuse``: an event its topic does not carry (``streams/kafka/channels.py``: a model reply on the
intake) is dead-lettered as ``refused``, and not remembered as handled: a forgery may borrow the id of
a real event still to come.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING

from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.outages import Outage, outage_of
from agentstream.streams.core.signals import Abandoned
from agentstream.streams.kafka.channels import accepted_events, refusal
from agentstream.streams.runtime.failures import PartitionHolds, Rejector
from agentstream.streams.runtime.middleware.chain import Delivery, Next

if TYPE_CHECKING:
    from agentstream.streams.kafka.topics import Topics
    from agentstream.streams.runtime.publisher import Runtime

log = logging.getLogger(__name__)


class Decode:
    def __init__(self, service: str, runtime: Runtime, holds: PartitionHolds, reject: Rejector,
                 stats: MutableMapping[str, int]) -> None:
        self.service = service
        self.runtime = runtime
        self.holds = holds
        self.reject = reject
        self.stats = stats

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        record, value = delivery.record, delivery.value
        rounds = 0
        outage: Outage | None = None
        try:
            while True:
                try:
                    delivery.decoded = await self.runtime.codec.decode_async(value, raise_outages=True)
                    break
                except DecodeError as exc:
                    log.warning("%s: %s[%d]@%d dead-lettered: %s", self.service, record.topic, record.partition,
                                record.offset, exc)
                    await self.reject(record, value, exc.kind, exc.reason)
                    return
                except (asyncio.CancelledError, Abandoned):
                    raise
                except Exception as exc:
                    dependency = outage_of(exc)
                    if dependency is None:
                        raise
                    if outage is None:
                        outage = self.holds.hold(delivery.tp, dependency, exc)
                        log.warning("%s: %s[%d]@%d has a schema id to look up and %s is unavailable (%s: %s); "
                                    "it waits", self.service, record.topic, record.partition, record.offset,
                                    dependency, type(exc).__name__, exc)
                    rounds += 1
                    self.stats["outage_retries"] += 1
                    await self.holds.sleep(rounds)
        finally:
            if outage is not None:
                self.holds.release(delivery.tp, outage)
        await call_next(delivery)


class Refuse:
    def __init__(self, service: str, topics: Topics, reject: Rejector) -> None:
        self.service = service
        #: The events each topic of the contract carries: anything else is refused.
        self.accepted = accepted_events(topics)
        self.reject = reject

    async def __call__(self, delivery: Delivery, call_next: Next) -> None:
        record, event = delivery.record, delivery.event
        refused = refusal(self.accepted, record.topic, event)
        if refused is not None:
            log.warning("%s: %s[%d]@%d refused: %s", self.service, record.topic, record.partition, record.offset,
                        refused)
            await self.reject(record, delivery.value, "refused", refused, run_id=event.run_id)
            return
        await call_next(delivery)


__all__ = ["Decode", "Refuse"]
