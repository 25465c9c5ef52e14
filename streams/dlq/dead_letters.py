"""The dead-letter topic for people.

``DeadLetters(settings)`` reads the dead-letter topic under the settings' prefix: ``list`` (with filters),
``show`` (everything, and the original event decoded when it decodes) and ``redrive`` (republish the
original record to its source topic and partition, e.g. after a fix). A truncated letter's original is
read back from the source topic, checked against the letter's digest, and refused when no longer
retained. Re-drives are recorded in PostgreSQL (``dlq_redrives``, migration 0009:
``agentstream.streams.dlq.redrives``) so that a letter is re-driven once unless forced; the copy carries
``agentstream-redrive`` naming the letter it came from. ``agentstream dlq list|show|redrive`` is the
command-line front.

Building and publishing letters (the hot path of the runtime and the services) is the backbone's:
``agentstream.streams.runtime.dead_letters``.
"""

from __future__ import annotations

import builtins
import hashlib
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DeadLetterError, DecodeError
from agentstream.streams.core.events import DeadLetter, Event
from agentstream.streams.core.ids import default_instance
from agentstream.streams.dlq.letters import (
    REDRIVE_HEADER,
    LetterDetails,
    RedriveAction,
    RedriveResult,
    StoredLetter,
    ValueFrom,
    readable,
)
from agentstream.streams.dlq.redrives import RedriveLog, already
from agentstream.streams.kafka.channels import CHANNELS
from agentstream.streams.kafka.codec import Codec, codec_for
from agentstream.streams.kafka.topics import Topics


def redrivable_topics(topics: Topics) -> frozenset[str]:
    """The topics under ``topics.prefix`` a letter may be re-driven to (the channels marked redrivable:
    what the operator may write on a secure stack, docs/security.md)."""
    return frozenset(getattr(topics, spec.topic) for spec in CHANNELS if spec.redrivable)


@dataclass(frozen=True)
class _Original:
    """The record to republish, and where it came from (``letter`` or ``source``)."""

    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]
    origin: ValueFrom


class DeadLetters:
    """The dead-letter topic under ``settings.topic_prefix``, for people: list, show, re-drive.

    ``async with DeadLetters(settings) as dlq: await dlq.list(kind="undecodable")``. Reading needs only
    Kafka; re-drive bookkeeping (and the re-drive counts in ``list``) uses PostgreSQL. ``targets``: when
    given, a letter whose source topic is not one of them is refused (the gateway passes its cell's
    ``redrivable_topics``, so a letter can never move a record into another cell)."""

    def __init__(self, settings: Settings, *, codec: Codec | None = None, redriven_by: str | None = None,
                 read_timeout_s: float = 15.0, targets: frozenset[str] | None = None) -> None:
        self.settings = settings
        self._own_codec = codec is None
        self.codec = codec or codec_for(settings)
        self.topic = Topics(prefix=settings.topic_prefix).dlq
        self.redriven_by = redriven_by if redriven_by is not None else default_instance()
        self.read_timeout_s = read_timeout_s
        self.targets = targets
        self._redrives = RedriveLog(settings, self.topic)
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> DeadLetters:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        await self._redrives.close()
        if self._own_codec:
            await self.codec.close()

    # -- list and show -----------------------------------------------------------------------------
    async def list(self, *, kind: str | None = None, source_topic: str | None = None,
                   limit: int | None = None) -> list[StoredLetter]:
        """The letters matching the filters, oldest first; with ``limit``, the most recent ``limit``.
        A record that is not a decodable letter is listed (with its problem) only without filters."""
        kept: deque[StoredLetter] = deque(maxlen=limit or None)
        async for stored in self._scan():
            if _matches(stored, kind, source_topic):
                kept.append(stored)
        counts = await self._redrives.counts([s.offset for s in kept])
        return [replace(s, redrives=counts.get(s.offset, 0)) if counts is not None else s for s in kept]

    async def show(self, offset: int) -> LetterDetails:
        """Everything about the letter at ``offset``, and the original event when it decodes."""
        stored = await self._letter_at(offset)
        letter = stored.letter
        original: Event | None = None
        problem: str | None = stored.problem
        if letter is not None:
            if letter.truncated:
                problem = (f"the letter keeps {len(letter.value or b'')} of {letter.value_size} bytes; the original "
                           f"is at {_source(letter)} (redrive reads it from there while it is retained)")
            else:
                try:
                    original = await self.codec.decode_async(letter.value)
                except DecodeError as exc:
                    problem = f"the original does not decode: {exc}"
        return LetterDetails(stored, original, problem, await self._redrives.rows(stored))

    # -- redrive -----------------------------------------------------------------------------------
    async def redrive(self, offsets: Sequence[int] = (), *, every: bool = False, kind: str | None = None,
                      source_topic: str | None = None, dry_run: bool = False,
                      force: bool = False) -> builtins.list[RedriveResult]:
        """Republish the original records of the letters at ``offsets`` (or, with ``every``, of all the
        letters matching ``kind`` / ``source_topic``) to their source topic and partition, each with its
        value, key and headers plus ``agentstream-redrive``. A letter already re-driven is skipped
        unless ``force``; ``dry_run`` only says what would happen."""
        if bool(offsets) == every:
            raise DeadLetterError("name the letters' offsets, or ask for every letter (--all), not both")
        if every:
            chosen = [s for s in await self.list(kind=kind, source_topic=source_topic) if s.letter is not None]
            return [await self._redrive_one(stored, dry_run=dry_run, force=force) for stored in chosen]
        results: builtins.list[RedriveResult] = []
        for offset in offsets:
            try:
                stored = await self._letter_at(offset)
            except DeadLetterError as exc:
                results.append(RedriveResult(offset, "refused", str(exc)))
                continue
            results.append(await self._redrive_one(stored, dry_run=dry_run, force=force))
        return results

    async def _redrive_one(self, stored: StoredLetter, *, dry_run: bool, force: bool) -> RedriveResult:
        letter = stored.letter
        if letter is None:
            return RedriveResult(stored.offset, "refused", f"not a dead letter: {stored.problem}")
        source = _source(letter)
        if self.targets is not None and letter.source_topic not in self.targets:
            return RedriveResult(stored.offset, "refused", f"{letter.source_topic} is not a topic this letter may be "
                                 "re-driven to here", source)
        earlier = await self._redrives.rows(stored)
        if earlier and not force:
            return RedriveResult(stored.offset, "skipped", already(earlier[-1]), source)
        try:
            original = await self._original(letter)
        except DeadLetterError as exc:
            return RedriveResult(stored.offset, "refused", str(exc), source)
        if dry_run:
            return RedriveResult(stored.offset, "would_redrive",
                                 f"would republish {_size(original.value)} from the {original.origin} to {source}",
                                 source, value_from=original.origin)
        try:
            claim = await self._redrives.claim(stored, letter, original.origin, force, by=self.redriven_by)
        except DeadLetterError as exc:  # a login that may not re-drive: refused before anything is published
            return RedriveResult(stored.offset, "refused", str(exc), source)
        if claim is None:
            return RedriveResult(stored.offset, "skipped", "re-driven by someone else meanwhile", source)
        try:
            offset = await self._republish(stored, letter, original)
        except KafkaError as exc:
            await self._redrives.settle(claim, None)
            return RedriveResult(stored.offset, "failed", f"{type(exc).__name__}: {exc}", source)
        await self._redrives.settle(claim, offset)
        return RedriveResult(stored.offset, "redriven",
                             f"{_size(original.value)} from the {original.origin} → "
                             f"{letter.source_topic}[{letter.source_partition}]@{offset}",
                             source, target_offset=offset, value_from=original.origin)

    async def _original(self, letter: DeadLetter) -> _Original:
        """The record to republish: the letter's own when whole, else read back from the source topic
        and checked against the letter's size and digest."""
        if not letter.truncated:
            await _require_partition(self.settings, letter.source_topic, letter.source_partition,
                                     f"the source of this letter ({_source(letter)})")
            return _Original(letter.value, letter.key, list(letter.headers.items()), "letter")
        record = await self._read_record(letter.source_topic, letter.source_partition, letter.source_offset,
                                         what=f"the original of this truncated letter ({_source(letter)})")
        value = record.value
        digest = None if value is None else hashlib.sha256(value).hexdigest()
        if digest != letter.value_sha256 or (value is not None and len(value) != letter.value_size):
            raise DeadLetterError(f"the record at {_source(letter)} is not this letter's original (size or SHA-256 "
                                  "differ: the topic was recreated?); not re-driving it")
        return _Original(value, record.key, list(record.headers or ()), "source")

    async def _republish(self, stored: StoredLetter, letter: DeadLetter, original: _Original) -> int:
        producer = await self._redrive_producer()
        headers = [(k, v) for k, v in original.headers if k != REDRIVE_HEADER]
        headers.append((REDRIVE_HEADER, stored.address.encode()))
        metadata = await producer.send_and_wait(letter.source_topic, original.value, key=original.key,
                                                partition=letter.source_partition, headers=headers)
        return metadata.offset

    async def _redrive_producer(self) -> AIOKafkaProducer:
        """Compressed, with room for the largest record a broker accepts compressed (a truncated
        letter's original is larger than a letter may be, often larger than a record uncompressed)."""
        if self._producer is None:
            producer = AIOKafkaProducer(**self.settings.kafka_options(), acks="all",
                                        enable_idempotence=True, compression_type="gzip",
                                        max_request_size=64 * 1024 * 1024, request_timeout_ms=30_000)
            await producer.start()
            self._producer = producer
        return self._producer

    # -- Kafka -------------------------------------------------------------------------------------
    async def _scan(self) -> AsyncIterator[StoredLetter]:
        """Every record of the dead-letter topic up to where it ends now."""
        tp = TopicPartition(self.topic, 0)
        async with self._consumer() as consumer:
            await _require_topic(consumer, self.topic, "dead-letter topic")
            consumer.assign([tp])
            begin = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            if begin >= end:
                return
            consumer.seek(tp, begin)
            next_offset = begin
            deadline = time.monotonic() + self.read_timeout_s
            while next_offset < end:
                batch = (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])
                if batch:
                    deadline = time.monotonic() + self.read_timeout_s
                elif time.monotonic() > deadline:
                    raise DeadLetterError(f"{self.topic} stopped answering at offset {next_offset} of {end}")
                for msg in batch:
                    if msg.offset >= end:
                        return
                    await self.codec.learn(msg.value)  # a letter from a process with a newer schema
                    yield self._stored(msg)
                    next_offset = msg.offset + 1
                if not batch:
                    next_offset = max(next_offset, await consumer.position(tp))

    async def _letter_at(self, offset: int) -> StoredLetter:
        msg = await self._read_record(self.topic, 0, offset, what=f"letter {offset}")
        await self.codec.learn(msg.value)
        return self._stored(msg)

    async def _read_record(self, topic: str, partition: int, offset: int, *,
                           what: str) -> ConsumerRecord[bytes, bytes]:
        """The record at ``topic[partition]@offset``; ``DeadLetterError`` when it is not (or no longer) there."""
        tp = TopicPartition(topic, partition)
        where = f"{topic}[{partition}]@{offset}"
        await _require_partition(self.settings, topic, partition, what)
        async with self._consumer() as consumer:
            consumer.assign([tp])
            begin = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            if offset >= end or offset < 0:
                raise DeadLetterError(f"{what}: there is no record {where} ({topic}[{partition}] ends at {end})")
            if offset < begin:
                raise DeadLetterError(f"{what}: {where} is no longer retained ({topic}[{partition}] now starts "
                                      f"at {begin}); it cannot be re-driven")
            consumer.seek(tp, offset)
            gone = DeadLetterError(f"{what}: {where} is no longer retained (compacted or deleted)")
            deadline = time.monotonic() + self.read_timeout_s
            while time.monotonic() < deadline:
                batch = (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])
                for msg in batch:
                    if msg.offset == offset:
                        return msg
                    if msg.offset > offset:
                        raise gone
                if not batch and await consumer.position(tp) > offset:  # skipped: a marker, or compacted
                    raise gone
            raise DeadLetterError(f"{what}: reading {where} timed out after {self.read_timeout_s:g} s")

    def _stored(self, msg: ConsumerRecord[bytes, bytes]) -> StoredLetter:
        timestamp = datetime.fromtimestamp(msg.timestamp / 1000, UTC)
        try:
            event = self.codec.decode(msg.value)
        except DecodeError as exc:
            return StoredLetter(msg.topic, msg.partition, msg.offset, timestamp, None, str(exc))
        if not isinstance(event, DeadLetter):
            return StoredLetter(msg.topic, msg.partition, msg.offset, timestamp, None,
                                f"a {type(event).__name__}, not a DeadLetter")
        return StoredLetter(msg.topic, msg.partition, msg.offset, timestamp, event)

    def _consumer(self) -> _Consumer:
        return _Consumer(self.settings)


class _Consumer:
    """A group-less consumer for reading a few partitions by offset (``async with``)."""

    def __init__(self, settings: Settings) -> None:
        self.consumer = AIOKafkaConsumer(**settings.kafka_options(), enable_auto_commit=False,
                                         auto_offset_reset="earliest", max_partition_fetch_bytes=16 * 1024 * 1024,
                                         fetch_max_bytes=64 * 1024 * 1024)

    async def __aenter__(self) -> AIOKafkaConsumer:
        await self.consumer.start()
        return self.consumer

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()


async def _require_topic(consumer: AIOKafkaConsumer, topic: str, what: str) -> None:
    if topic not in await consumer.topics():
        raise DeadLetterError(f"{what}: there is no topic {topic}")


async def _require_partition(settings: Settings, topic: str, partition: int, what: str) -> None:
    """Checked before reading or producing: aiokafka would wait for metadata that never comes."""
    admin = AIOKafkaAdminClient(**settings.kafka_options())
    await admin.start()
    try:
        (description,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if description["error_code"]:
        raise DeadLetterError(f"{what}: there is no topic {topic}")
    if partition not in {p["partition"] for p in description["partitions"]}:
        raise DeadLetterError(f"{what}: {topic} has no partition {partition}")


def _matches(stored: StoredLetter, kind: str | None, source_topic: str | None) -> bool:
    letter = stored.letter
    if letter is None:
        return kind is None and source_topic is None
    return (kind is None or letter.error_kind == kind) and (source_topic is None or letter.source_topic == source_topic)


def _source(letter: DeadLetter) -> str:
    return f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}"


def _size(value: bytes | None) -> str:
    return "no value" if value is None else f"{len(value)} bytes"


__all__ = ["REDRIVE_HEADER", "DeadLetters", "LetterDetails", "RedriveAction", "RedriveResult", "StoredLetter",
           "ValueFrom", "readable", "redrivable_topics"]
