"""An in-memory broker: topics as lists, a ``Runtime`` that publishes into them, and handlers driven
one record at a time — unit tests of a service's handler, or of code that reads a topic, without Kafka.

    async with InMemoryBroker() as broker:
        handled = await broker.deliver(service.handle, request)   # one try of the handler
        result = handled.one(ToolCallCompleted)

What it is not: the consumer runtime. ``deliver`` hands one record to a handler the way the runtime's
``ServiceRunner`` does (a ``Record`` and a ``Context``; the record is done once what it emitted is
acknowledged) but applies none of the runtime's policies: no de-duplication, no retries, no outage
waits, no dead letter for a failed handler — an exception the handler raises comes out of ``deliver``,
for the test to judge. Those policies are the runtime's, tested on their own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar, cast, overload

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord, RecordMetadata

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import Event
from agentstream.streams.kafka.channels import CHANNELS
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.kafka.topics import Topics, key_partitioner
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, Handler, Record
from agentstream.streams.telemetry import trace_context as tracing

E = TypeVar("E", bound=Event)


@dataclass(frozen=True)
class Handled:
    """What one try of a handler did: the record it was handed, the events it published (topic, event),
    in order, and whether the runtime would remember the event's id as handled (``Context.forget``)."""

    record: Record
    sent: list[tuple[str, Event]] = field(default_factory=list)
    remembered: bool = True

    def of(self, kind: type[E]) -> list[E]:
        """The events of type ``kind`` it published, in order."""
        return [e for _, e in self.sent if isinstance(e, kind)]

    def one(self, kind: type[E]) -> E:
        """The one event of type ``kind`` it published; AssertionError (naming what it did publish) otherwise."""
        found = self.of(kind)
        if len(found) != 1:
            published = ", ".join(f"{type(e).__name__} on {t}" for t, e in self.sent) or "nothing"
            raise AssertionError(f"expected one {kind.__name__}, the handler published {published}")
        return found[0]


class InMemoryBroker:
    """Topics as in-memory partition logs; ``runtime`` publishes into them (``async with`` starts it).

    ``settings`` default to a local-looking configuration that nothing connects to; the codec to the
    package's schemas (no registry, no schemas topic). Run-keyed topics have ``settings.partitions``
    partitions, the others as many as the topic catalogue says, and a keyed record goes to the partition
    Kafka would choose. ``hold_acks`` leaves acknowledgements pending until ``ack_all()``; ``send_error``
    (while set) is raised by every send, e.g. a ``KafkaTimeoutError`` for a broker outage."""

    def __init__(self, settings: Settings | None = None, *, codec: Codec | None = None) -> None:
        self.settings = settings or Settings(kafka_bootstrap="in-memory:9092",
                                             database_url="postgresql://in-memory/agentstream")
        self.codec = codec or Codec(LocalRegistry(self.settings.schemas_dir))
        self.topics = Topics.of(self.settings)
        self.logs: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
        #: Every record appended, in order, across topics.
        self.appended: list[ConsumerRecord[bytes, bytes]] = []
        self.hold_acks = False
        self.send_error: BaseException | None = None
        self._acks: list[tuple[asyncio.Future[RecordMetadata], RecordMetadata]] = []
        self._partitions = {spec.name: spec.partitions for spec in self.topics.specs()}
        self._arrived = asyncio.Event()
        self._runtime: Runtime | None = None

    async def __aenter__(self) -> InMemoryBroker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Create ``runtime``: a real ``Runtime`` whose producer is this broker's."""
        if self._runtime is None:
            runtime = Runtime(self.settings, self.codec, tracing=None)
            await runtime.producer.stop()  # never started: closed so that it does not warn
            runtime.producer = cast(AIOKafkaProducer, InMemoryProducer(self))
            self._runtime = runtime

    async def close(self) -> None:
        if self._runtime is not None:
            await self._runtime.stop()
            self._runtime = None

    @property
    def runtime(self) -> Runtime:
        if self._runtime is None:
            raise RuntimeError("the broker is not started: use `async with InMemoryBroker() as broker:`")
        return self._runtime

    # -- the log -----------------------------------------------------------------------------------
    def partitions(self, topic: str) -> int:
        return self._partitions.get(topic, self.topics.partitions)

    def append(self, topic: str, value: bytes | None, *, key: bytes | None = None, partition: int | None = None,
               headers: Sequence[tuple[str, bytes]] = (), timestamp_ms: int | None = None,
               ) -> ConsumerRecord[bytes, bytes]:
        """Append a record (to ``partition``, else where its key hashes, else partition 0); returns it."""
        if partition is None:
            partition = 0 if key is None else key_partitioner(key, range(self.partitions(topic)), ())
        log = self.logs.setdefault(TopicPartition(topic, partition), [])
        record: ConsumerRecord[bytes, bytes] = ConsumerRecord(
            topic=topic, partition=partition, offset=len(log),
            timestamp=timestamp_ms if timestamp_ms is not None else round(time.time() * 1000), timestamp_type=0,
            key=key, value=value, checksum=None, serialized_key_size=len(key or b""),
            serialized_value_size=len(value or b""), headers=tuple(headers))
        log.append(record)
        self.appended.append(record)
        self._arrived.set()
        self._arrived = asyncio.Event()
        return record

    def publish(self, topic: str, event: Event, *, key: str | None = None, partition: int | None = None,
                headers: Sequence[tuple[str, bytes]] = ()) -> ConsumerRecord[bytes, bytes]:
        """Append ``event``, encoded, keyed by its run id unless ``key`` says otherwise."""
        return self.append(topic, self.codec.encode(event), key=(key if key is not None else event.run_id).encode(),
                           partition=partition, headers=headers)

    def records(self, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
        """The records of ``topic``, in the order they were appended."""
        return [r for r in self.appended if r.topic == topic]

    @overload
    def events(self, topic: str) -> list[Event]: ...

    @overload
    def events(self, topic: str, kind: type[E]) -> list[E]: ...

    def events(self, topic: str, kind: type[Event] = Event) -> list[Any]:
        """The events of ``topic`` (of type ``kind``), in order; values that are not events are left out."""
        return [e for e in (self.decode(r.value) for r in self.records(topic)) if isinstance(e, kind)]

    def decode(self, value: bytes | None) -> Event | None:
        try:
            return self.codec.decode(value)
        except DecodeError:
            return None

    def topic_of(self, event: Event) -> str:
        """The topic of the contract that carries events of ``event``'s type (streams/kafka/channels.py)."""
        for spec in CHANNELS:
            if type(event) in spec.events:
                return str(getattr(self.topics, spec.topic))
        raise ValueError(f"no topic carries {type(event).__name__}: name the topic")

    def ack_all(self) -> None:
        """Acknowledge every send left pending by ``hold_acks``."""
        for ack, metadata in self._acks:
            if not ack.done():
                ack.set_result(metadata)
        self._acks.clear()

    # -- handlers and readers ----------------------------------------------------------------------
    async def deliver(self, handler: Handler, event: Event, *, topic: str | None = None, service: str = "test",
                      key: str | None = None, headers: Sequence[tuple[str, bytes]] = ()) -> Handled:
        """Append ``event`` to ``topic`` (default: the topic that carries its type) and hand it to
        ``handler`` as the runtime would, once: returns what the handler published once all of it was
        acknowledged. What the handler raises is raised here."""
        stored = self.publish(topic or self.topic_of(event), event, key=key, headers=headers)
        record = Record(topic=stored.topic, partition=stored.partition, offset=stored.offset, key=stored.key,
                        timestamp_ms=stored.timestamp, headers=dict(stored.headers), consumed_at=datetime.now(UTC))
        ctx = Context(self.runtime, service, record)
        mark = len(self.appended)

        async def attempt() -> None:
            tracing.CURRENT.set(ctx.out_traceparent)  # in this task only, as the runtime does per record
            await handler(event, ctx)
            await ctx.flush()

        await asyncio.create_task(attempt())
        sent = [(r.topic, e) for r in self.appended[mark:] if (e := self.decode(r.value)) is not None]
        return Handled(record, sent, ctx.remembered)

    def consumer(self, **config: Any) -> AIOKafkaConsumer:
        """A consumer without a group over this broker's logs, for code that assigns partitions itself
        (``assign``, ``seek``, ``getmany``, ``end_offsets``): put it in place of such code's consumer."""
        return cast(AIOKafkaConsumer, InMemoryConsumer(self, config))


class InMemoryProducer:
    """The part of ``AIOKafkaProducer`` agentstream uses, appending to an ``InMemoryBroker``."""

    def __init__(self, broker: InMemoryBroker) -> None:
        self.broker = broker

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def flush(self) -> None:
        pass

    async def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                   partition: int | None = None, timestamp_ms: int | None = None,
                   headers: Sequence[tuple[str, bytes]] | None = None) -> asyncio.Future[RecordMetadata]:
        broker = self.broker
        if broker.send_error is not None:
            raise broker.send_error
        record = broker.append(topic, value, key=key, partition=partition, headers=headers or (),
                               timestamp_ms=timestamp_ms)
        ack: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        metadata = RecordMetadata(topic, record.partition, TopicPartition(topic, record.partition), record.offset,
                                  record.timestamp, 0, 0)
        if broker.hold_acks:
            broker._acks.append((ack, metadata))
        else:
            ack.set_result(metadata)
        return ack

    async def send_and_wait(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                            partition: int | None = None, timestamp_ms: int | None = None,
                            headers: Sequence[tuple[str, bytes]] | None = None) -> RecordMetadata:
        return await (await self.send(topic, value, key, partition, timestamp_ms, headers))


class InMemoryConsumer:
    """The group-less part of ``AIOKafkaConsumer``: assigned partitions, read from a position."""

    def __init__(self, broker: InMemoryBroker, config: dict[str, Any]) -> None:
        self.broker = broker
        self.config = config
        self.started = self.stopped = False
        self._positions: dict[TopicPartition, int] = {}

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        self._positions = {tp: self._positions.get(tp, self._reset(tp)) for tp in partitions}

    def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    def _reset(self, tp: TopicPartition) -> int:
        earliest = self.config.get("auto_offset_reset", "latest") == "earliest"
        return 0 if earliest else len(self.broker.logs.get(tp, ()))

    async def beginning_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 0 for tp in partitions}

    async def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: len(self.broker.logs.get(tp, ())) for tp in partitions}

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._positions[partition] = offset

    async def position(self, partition: TopicPartition) -> int:
        return self._positions[partition]

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None,
                      ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        """What the assigned partitions (or ``partitions``) hold past their positions; when nothing,
        waits up to ``timeout_ms`` for a record to arrive, as a fetch would."""
        batch = self._take(partitions, max_records)
        if not batch and timeout_ms > 0:
            arrived = self.broker._arrived
            try:
                await asyncio.wait_for(arrived.wait(), timeout_ms / 1000)
            except TimeoutError:
                return {}
            batch = self._take(partitions, max_records)
        return batch

    def _take(self, partitions: Sequence[TopicPartition], max_records: int | None,
              ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        out: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
        budget = max_records if max_records is not None else 1 << 30
        for tp in sorted(partitions or self._positions):
            log = self.broker.logs.get(tp, [])
            position = self._positions[tp]
            records = log[position:position + budget]
            if records:
                out[tp] = records
                self._positions[tp] = position + len(records)
                budget -= len(records)
        return out


__all__ = ["Handled", "InMemoryBroker", "InMemoryConsumer", "InMemoryProducer"]
