"""Reading a compacted catalogue topic whole: the part the tool and agent catalogues share.

A catalogue (``agent.tools``, ``agent.agents``) is one partition of registrations, compacted by a key
that keeps every distinct registration. A reader is one consumer without a group, assigned to that
partition: the first refresh reads it from the beginning up to its end offset, later ones read only
what was published since. Every read is bounded by ``timeout_s`` and raises the catalogue's
``unavailable`` error past it. Concurrent callers share one read: a refresh asked for while another was
running waits for the next one, not for a third.

What the registrations mean is the subclass's business (``_fold``: every registration as compaction
keeps them, in the order they were published).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Generic, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.config.masking import mask_url
from agentstream.streams.core.errors import AgentStreamError, DecodeError
from agentstream.streams.core.events import Event
from agentstream.streams.core.outages import KAFKA
from agentstream.streams.kafka.codec import Codec

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)


class CompactedCatalog(Generic[E]):
    """A view of a compacted catalogue topic, refreshed every ``ttl_s`` (``_maybe_refresh``) or on demand
    (``_refresh``). Subclasses set ``event_type``, ``label`` and ``creators`` and implement ``_fold``,
    ``_key`` and ``_unavailable``."""

    #: The registrations this topic carries (any other record is skipped).
    event_type: type[E]
    #: What the catalogue is, in messages ("tool catalogue").
    label: str = "catalogue"
    #: Who creates its topic, in the message of a reader that waits for it.
    creators: str = "workers and `agentstream dev up` create it"

    def __init__(self, bootstrap: str, topic: str, codec: Codec, *, ttl_s: float = 5.0,
                 timeout_s: float = 10.0, auth: KafkaAuth) -> None:
        self.bootstrap = bootstrap
        self.auth = auth
        self.topic = topic
        self.codec = codec
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._tp = TopicPartition(topic, 0)
        self._consumer: AIOKafkaConsumer | None = None
        #: Every registration on the topic by record key (as compaction keeps them), with its offset.
        self._records: dict[str, tuple[int, E]] = {}
        self._loaded_at = -math.inf
        self._read_started = -math.inf  # when the last successful read began
        self._lock = asyncio.Lock()
        self._waiting_for = ""

    # -- what subclasses say -------------------------------------------------------------------
    def _fold(self, registrations: list[E]) -> None:
        """Rebuild the view from every registration, in the order they were published."""
        raise NotImplementedError

    def _key(self, event: E) -> str:
        """The record key of ``event``, for a record that has none."""
        raise NotImplementedError

    def _unavailable(self, message: str) -> AgentStreamError:
        """The error a read that failed raises (retriable, Kafka's outage)."""
        raise NotImplementedError

    # -- reading -------------------------------------------------------------------------------
    async def _maybe_refresh(self) -> None:
        """Read unless a read newer than the TTL has finished."""
        if time.monotonic() - self._loaded_at > self.ttl_s:
            await self._refresh(asked_at=time.monotonic() - self.ttl_s)

    async def close(self) -> None:
        """Stop the consumer (a later call opens a new one and reads the topic from the beginning)."""
        async with self._lock:
            await self._drop_consumer()

    async def _refresh(self, *, asked_at: float) -> None:
        """Read to the end, unless a read that began at or after ``asked_at`` has finished meanwhile."""
        async with self._lock:
            if self._read_started >= asked_at:
                return
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self._read_to_end()
            except (TimeoutError, KafkaError) as exc:
                await self._drop_consumer()  # the next refresh starts over from the beginning
                why = f"no answer within {self.timeout_s:g} s" if isinstance(exc, TimeoutError) else repr(exc)
                unavailable = self._unavailable(
                    f"cannot read the {self.label} ({self.topic} on {mask_url(self.bootstrap)}) while waiting for "
                    f"{self._waiting_for}: {why}")
                # The broker's outage, whoever reads: a planner handling a task waits it out with the task's
                # partition paused (a bounded retry would dead-letter the task while the broker restarts).
                unavailable.dependency = KAFKA  # type: ignore[attr-defined]
                raise unavailable from exc
            self._read_started, self._loaded_at = started, time.monotonic()

    async def _read_to_end(self) -> None:
        fresh = self._consumer is None
        if self._consumer is None:
            self._consumer = await self._open()
        consumer = self._consumer
        self._waiting_for = "its end offset"
        end = (await consumer.end_offsets([self._tp]))[self._tp]
        records = {} if fresh else self._records  # from scratch: a compacted-away tombstone leaves nothing stale
        self._waiting_for = f"its records up to offset {end}"
        while await consumer.position(self._tp) < end:
            batch = await consumer.getmany(self._tp, timeout_ms=200)
            for record in batch.get(self._tp, []):
                await self.codec.learn(record.value)  # a newer process's registration: its schema's id
                self._apply(records, record)
        self._records = records
        self._fold([e for _, e in sorted(records.values(), key=lambda r: r[0])])

    async def _open(self) -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(**kafka_options(self.bootstrap, self.auth), enable_auto_commit=False,
                                    isolation_level="read_committed", auto_offset_reset="earliest",
                                    fetch_max_wait_ms=100)
        try:
            self._waiting_for = "the broker"
            await consumer.start()
            await self._topic_created(consumer)
            consumer.assign([self._tp])
            await consumer.seek_to_beginning(self._tp)
        except BaseException:
            await consumer.stop()
            raise
        return consumer

    async def _topic_created(self, consumer: AIOKafkaConsumer) -> None:
        """Return once the topic exists. Asked first because a consumer assigned to a topic that does not
        exist only times out, and the error should say that no worker has created it yet."""
        self._waiting_for = f"{self.topic} to exist ({self.creators})"
        while True:
            if self.topic in await consumer.topics():
                return
            await asyncio.sleep(0.2)

    def _apply(self, records: dict[str, tuple[int, E]], record: ConsumerRecord[bytes, bytes]) -> None:
        """The latest record of a key wins, as compaction has it; a tombstone (no value) removes that key's
        registration (a name's registrations are removed by tombstoning each of their keys)."""
        key = record.key.decode(errors="replace") if record.key is not None else None
        if record.value is None:
            if key is not None:
                records.pop(key, None)
            return
        try:
            event = self.codec.decode(record.value)
        except DecodeError as exc:
            log.warning("%s: %s offset %d skipped: %s", self.label, self.topic, record.offset, exc)
            return
        if isinstance(event, self.event_type):
            records[key or self._key(event)] = (record.offset, event)

    async def _drop_consumer(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()


__all__ = ["CompactedCatalog"]
