"""Dead letters: building ones that can always be sent, and working with them afterwards.

Sending. A dead letter carries the record a service gave up on (value, key, headers) with the reason.
A record of about 1 MiB — or a larger one that the broker accepted compressed — would make a letter
too large for the broker, the letter's publish would fail, the service would stop, restart, meet the
same record again: a crash loop. So a letter is never larger than ``Settings.max_event_bytes``:
``dead_letter`` keeps a prefix of the value (and bounds the key, each header and the reason), records
the original value's size and SHA-256, and flags the letter ``truncated``. ``publish_dead_letter`` waits
out a broker outage (retriable errors, capped backoff, for as long as it lasts) and answers a refusal
(a non-retriable error, such as a size limit lower than ours) with a smaller letter.

Working with them. ``DeadLetters(settings)`` reads the dead-letter topic under the settings' prefix:
``list`` (with filters), ``show`` (everything, and the original event decoded when it decodes) and
``redrive`` (republish the original record to its source topic and partition, e.g. after a fix). A
truncated letter's original is read back from the source topic, checked against the letter's digest,
and refused when no longer retained. Re-drives are recorded in PostgreSQL (``dlq_redrives``, migration
0009) so that a letter is re-driven once unless forced; the copy carries ``agentstream-redrive``
naming the letter it came from. ``agentstream dlq list|show|redrive`` is the command-line front.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import hashlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DeadLetterError, DecodeError
from agentstream.streams.core.events import DeadLetter, Event, default_instance, utcnow
from agentstream.streams.core.outages import KAFKA, backoff, outage_of
from agentstream.streams.kafka.codec import Codec, codec_for
from agentstream.streams.kafka.topics import Topics

if TYPE_CHECKING:
    from agentstream.streams.runtime.runner import Context, Runtime

log = logging.getLogger(__name__)

#: On a re-driven copy: ``"{dlq topic}:{partition}:{offset}"`` of the letter it came from.
REDRIVE_HEADER = "agentstream-redrive"

#: Always: a reason is a message for a person, not a payload.
REASON_CHARS = 4000
#: When a letter must be cut: what each part of the record may keep besides the value's prefix.
KEY_BYTES = 1024
HEADER_NAME_CHARS = 256
HEADER_VALUE_BYTES = 1024
MAX_HEADERS = 64
RUN_ID_CHARS = 256
#: The last resort (no value, key or headers): how much of the reason stays.
MINIMAL_REASON_CHARS = 256
#: Room for the Avro length prefix of the value (a zig-zag varint: at most 10 bytes).
_LENGTH_PREFIX = 10

#: Publishing a letter through an outage: capped exponential backoff with jitter.
BACKOFF_S = 0.2
MAX_BACKOFF_S = 10.0

#: What a re-drive did with a letter (``RedriveResult.action``).
RedriveAction: TypeAlias = Literal["redriven", "would_redrive", "skipped", "refused", "failed"]
#: Where a re-driven record came from: the letter itself, or (truncated letters) the source topic
#: (``dlq_redrives.value_from``, migration 0009).
ValueFrom: TypeAlias = Literal["letter", "source"]


# -- building and sending ---------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Rejected:
    """A record a service gives up on, and why: what a dead letter is made of. ``step`` is the letter's
    step id (deterministic, so a letter sent again after a crash is recognisably the same letter)."""

    run_id: str
    step: str
    service: str
    consumer: str
    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None
    value: bytes | None
    headers: Mapping[str, bytes] = field(default_factory=dict)
    error_kind: str
    reason: str
    parent_step_id: str | None = None


def dead_letter(rejected: Rejected, codec: Codec, max_bytes: int, *,
                created_at: datetime | None = None) -> DeadLetter:
    """The letter for ``rejected``, encoded in at most ``max_bytes``: whole when it fits, else cut.

    A cut letter keeps the value's longest prefix that fits beside the bounded key, headers and reason,
    and is flagged ``truncated``; ``value_size`` and ``value_sha256`` always describe the whole original
    value, so the original can be recognised where it is still retained. If even a letter without
    value, key and headers is larger than ``max_bytes`` (an absurdly small limit), that one is returned."""
    created_at = created_at or utcnow()
    value = rejected.value
    whole = _letter(rejected, created_at, key=rejected.key, value=value, headers=dict(rejected.headers),
                    reason=rejected.reason[:REASON_CHARS], truncated=False)
    if len(codec.encode(whole)) <= max_bytes:
        return whole
    bounded = replace(whole, key=_cut(rejected.key, KEY_BYTES), headers=_bounded_headers(rejected.headers),
                      value=None if value is None else b"", truncated=True)
    room = max_bytes - len(codec.encode(bounded)) - _LENGTH_PREFIX
    if room < 0:
        bounded = replace(bounded, key=None, headers={}, reason=rejected.reason[:MINIMAL_REASON_CHARS])
        room = max_bytes - len(codec.encode(bounded)) - _LENGTH_PREFIX
    if value is None or room <= 0:
        return bounded
    letter = replace(bounded, value=value[:room])
    overshoot = len(codec.encode(letter)) - max_bytes
    if overshoot > 0:  # never expected (room counts the length prefix); kept so the bound is a promise
        letter = replace(letter, value=value[:max(0, room - overshoot)])
    return letter


def _letter(rejected: Rejected, created_at: datetime, *, key: bytes | None, value: bytes | None,
            headers: dict[str, bytes], reason: str, truncated: bool) -> DeadLetter:
    original = rejected.value
    return DeadLetter.build(
        run_id=rejected.run_id[:RUN_ID_CHARS], step=rejected.step, service=rejected.service,
        parent_step_id=rejected.parent_step_id, created_at=created_at, consumer=rejected.consumer,
        source_topic=rejected.source_topic, source_partition=rejected.source_partition,
        source_offset=rejected.source_offset, key=key, value=value, headers=headers,
        error_kind=rejected.error_kind, reason=reason,
        value_size=None if original is None else len(original),
        value_sha256=None if original is None else hashlib.sha256(original).hexdigest(),
        truncated=truncated)


def _cut(data: bytes | None, limit: int) -> bytes | None:
    return None if data is None else data[:limit]


def _bounded_headers(headers: Mapping[str, bytes]) -> dict[str, bytes]:
    """At most ``MAX_HEADERS`` headers, each name and value cut to its bound."""
    bounded: dict[str, bytes] = {}
    for name, value in headers.items():
        if len(bounded) == MAX_HEADERS:
            break
        bounded[name[:HEADER_NAME_CHARS]] = value[:HEADER_VALUE_BYTES]
    return bounded


def size_budgets(max_bytes: int) -> tuple[int, ...]:
    """The sizes tried, in order, while the broker refuses letters: the configured bound, a sixteenth of
    it, and the minimal letter (no value, key or headers)."""
    return (max_bytes, max(1024, max_bytes // 16), 0)


def is_outage(exc: BaseException) -> bool:
    """A broker error that goes away by itself (streams/core/outages.py decides). Anything else is a refusal."""
    return outage_of(exc) == KAFKA


def backoff_delay(failures: int) -> float:
    """Seconds to wait after the ``failures``-th failed publish: doubling, capped, jittered."""
    return backoff(failures, base_s=BACKOFF_S, cap_s=MAX_BACKOFF_S)


async def refuse(runtime: Runtime, ctx: Context, event: Event, *, service: str, reason: str) -> DeadLetter:
    """Dead-letter the record ``ctx`` handles as ``refused``: it is not what it claims to be (a forged tool
    call, a decision nobody recorded). Its event id is not remembered as handled (``Context.forget``):
    event ids are predictable, and a forgery that borrowed a real event's id must not make the real one,
    arriving later, a duplicate to drop."""
    ctx.forget()
    record = ctx.record
    return await publish_dead_letter(runtime, Rejected(
        run_id=event.run_id, step=f"dlq:{record.topic}:{record.partition}:{record.offset}", service=service,
        parent_step_id=getattr(event, "step_id", None), consumer=service, source_topic=record.topic,
        source_partition=record.partition, source_offset=record.offset, key=record.key,
        value=runtime.codec.encode(event), headers=record.headers, error_kind="refused", reason=reason))


async def publish_dead_letter(runtime: Runtime, rejected: Rejected, *,
                              headers: Sequence[tuple[str, bytes]] = ()) -> DeadLetter:
    """Send ``rejected``'s letter to the dead-letter topic and wait for the broker's acknowledgement.

    Never gives up on a broker outage: a retriable error is retried with capped backoff for as long as
    it lasts (a shutdown cancels the wait, leaving the record uncommitted for the next owner). A
    refusal moves to the next smaller letter (``size_budgets``); once the minimal letter is refused too,
    it keeps retrying with backoff, logging each refusal, instead of stopping the service — a restart
    would meet the same record and fail the same way. Returns the letter that was sent."""
    budgets = size_budgets(runtime.settings.max_event_bytes)
    stage = failures = 0
    where = f"{rejected.source_topic}[{rejected.source_partition}]@{rejected.source_offset}"
    while True:
        letter = dead_letter(rejected, runtime.codec, budgets[stage])
        try:
            await (await runtime.send(runtime.topics.dlq, letter, key=letter.run_id, headers=headers))
            return letter
        except KafkaError as exc:
            failures += 1
            if not is_outage(exc) and stage + 1 < len(budgets):
                stage += 1
                log.warning("%s: the dead letter for %s was refused (%s: %s); sending a smaller one",
                            rejected.consumer, where, type(exc).__name__, exc)
                continue
            delay = backoff_delay(failures)
            log.log(logging.WARNING if is_outage(exc) else logging.ERROR,
                    "%s: the dead letter for %s could not be sent (%s: %s); trying again in %.1f s "
                    "(attempt %d)", rejected.consumer, where, type(exc).__name__, exc, delay, failures)
            await asyncio.sleep(delay)


# -- reading and re-driving -------------------------------------------------------------------------

@dataclass(frozen=True)
class StoredLetter:
    """One record of the dead-letter topic: where it is, and the letter (None when it does not decode,
    ``problem`` says why). ``redrives``: how often it was re-driven (None when not looked up)."""

    topic: str
    partition: int
    offset: int
    timestamp: datetime
    letter: DeadLetter | None
    problem: str | None = None
    redrives: int | None = None

    @property
    def address(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"

    def summary(self) -> dict[str, Any]:
        """What ``list`` shows, as JSON-ready values (the reason whole)."""
        out: dict[str, Any] = {"offset": self.offset, "partition": self.partition,
                               "time": self.timestamp.isoformat(), "redrives": self.redrives}
        letter = self.letter
        if letter is None:
            return {**out, "problem": self.problem}
        redrive_of = letter.headers.get(REDRIVE_HEADER)
        return {**out, "source_topic": letter.source_topic, "source_partition": letter.source_partition,
                "source_offset": letter.source_offset, "consumer": letter.consumer,
                "error_kind": letter.error_kind, "reason": letter.reason, "run_id": letter.run_id,
                "truncated": letter.truncated, "value_size": letter.value_size,
                "redrive_of": None if redrive_of is None else redrive_of.decode(errors="replace")}


@dataclass(frozen=True)
class LetterDetails:
    """What ``show`` tells about one letter: the stored letter, the original event when its value is
    whole and decodes (else why not), and the re-drives recorded so far."""

    stored: StoredLetter
    original: Event | None
    original_problem: str | None
    redrives: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        letter = self.stored.letter
        out = self.stored.summary()
        if letter is not None:
            out.update({
                "event_id": letter.event_id, "step_id": letter.step_id, "parent_step_id": letter.parent_step_id,
                "created_at": letter.created_at.isoformat(), "producer": letter.producer.service,
                "instance": letter.producer.instance, "key": readable(letter.key),
                "headers": {k: readable(v) for k, v in letter.headers.items()},
                "value_preview": readable(None if letter.value is None else letter.value[:160]),
                "value_base64": None if letter.value is None else base64.b64encode(letter.value).decode(),
                "value_kept": None if letter.value is None else len(letter.value),
                "value_sha256": letter.value_sha256})
        out.update({
            "original_type": None if self.original is None else type(self.original).__name__,
            "original": None if self.original is None else self.original.to_dict(),
            "original_problem": self.original_problem, "redrive_history": self.redrives})
        return out


@dataclass(frozen=True)
class RedriveResult:
    """What happened to one letter: ``redriven``, ``would_redrive`` (dry run), ``skipped`` (already
    re-driven), ``refused`` (cannot be: the message says why) or ``failed`` (the publish failed)."""

    offset: int
    action: RedriveAction
    detail: str
    source: str | None = None
    target_offset: int | None = None
    value_from: ValueFrom | None = None

    @property
    def ok(self) -> bool:
        return self.action in ("redriven", "would_redrive", "skipped")

    def as_dict(self) -> dict[str, Any]:
        return {"offset": self.offset, "action": self.action, "detail": self.detail, "source": self.source,
                "target_offset": self.target_offset, "value_from": self.value_from}


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
    Kafka; re-drive bookkeeping (and the re-drive counts in ``list``) uses PostgreSQL."""

    def __init__(self, settings: Settings, *, codec: Codec | None = None, redriven_by: str | None = None,
                 read_timeout_s: float = 15.0) -> None:
        self.settings = settings
        self._own_codec = codec is None
        self.codec = codec or codec_for(settings)
        self.topic = Topics(prefix=settings.topic_prefix).dlq
        self.redriven_by = redriven_by if redriven_by is not None else default_instance()
        self.read_timeout_s = read_timeout_s
        self._conn: asyncpg.Connection | None = None
        self._producer: AIOKafkaProducer | None = None

    async def __aenter__(self) -> DeadLetters:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
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
        counts = await self._redrive_counts([s.offset for s in kept])
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
        return LetterDetails(stored, original, problem, await self._redrive_rows(stored))

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
        earlier = await self._redrive_rows(stored)
        if earlier and not force:
            return RedriveResult(stored.offset, "skipped", _already(earlier[-1]), source)
        try:
            original = await self._original(letter)
        except DeadLetterError as exc:
            return RedriveResult(stored.offset, "refused", str(exc), source)
        if dry_run:
            return RedriveResult(stored.offset, "would_redrive",
                                 f"would republish {_size(original.value)} from the {original.origin} to {source}",
                                 source, value_from=original.origin)
        claim = await self._claim(stored, letter, original.origin, force)
        if claim is None:
            return RedriveResult(stored.offset, "skipped", "re-driven by someone else meanwhile", source)
        try:
            offset = await self._republish(stored, letter, original)
        except KafkaError as exc:
            await self._settle(claim, None)
            return RedriveResult(stored.offset, "failed", f"{type(exc).__name__}: {exc}", source)
        await self._settle(claim, offset)
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

    # -- PostgreSQL --------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _bookkeeping(self) -> AsyncIterator[asyncpg.Connection]:
        """The connection for ``dlq_redrives``; a database the migrations have not reached is a clear error."""
        if self._conn is None:
            self._conn = await asyncpg.connect(self.settings.database_url)
        try:
            yield self._conn
        except asyncpg.UndefinedTableError:
            raise DeadLetterError("this database has no dlq_redrives table yet: apply the migrations "
                                  "(`agentstream dev up`, or start a worker)") from None

    async def _redrive_rows(self, stored: StoredLetter) -> builtins.list[dict[str, Any]]:
        """The re-drives recorded for this letter, oldest first."""
        if stored.letter is None:
            return []
        async with self._bookkeeping() as conn:
            rows = await conn.fetch(
                """SELECT redriven_at, redriven_by, forced, status, value_from, source_topic, source_partition,
                          target_offset
                   FROM dlq_redrives
                   WHERE dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3 AND letter_event_id = $4
                   ORDER BY id""", stored.topic, stored.partition, stored.offset, stored.letter.event_id)
        return [dict(r) for r in rows]

    async def _redrive_counts(self, offsets: builtins.list[int]) -> dict[int, int] | None:
        """Re-drives per offset of the dead-letter topic; None (logged) when PostgreSQL cannot say."""
        if not offsets:
            return {}
        try:
            async with self._bookkeeping() as conn:
                rows = await conn.fetch(
                    """SELECT dlq_offset, count(*) AS n FROM dlq_redrives
                       WHERE dlq_topic = $1 AND dlq_partition = 0 AND dlq_offset = ANY($2::bigint[])
                       GROUP BY dlq_offset""", self.topic, offsets)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, DeadLetterError) as exc:
            log.warning("re-drive counts unavailable (%s: %s)", type(exc).__name__, exc)
            return None
        return {r["dlq_offset"]: r["n"] for r in rows}

    async def _claim(self, stored: StoredLetter, letter: DeadLetter, origin: ValueFrom, force: bool) -> int | None:
        """Record the re-drive before publishing it. The first unforced re-drive of a letter is unique
        (a partial unique index), so two people re-driving at once publish it once; a forced one adds a
        row. None when the letter was claimed by someone else meanwhile."""
        args = (stored.topic, stored.partition, stored.offset, letter.event_id, letter.source_topic,
                letter.source_partition, letter.source_offset, origin, self.redriven_by)
        insert = """INSERT INTO dlq_redrives (dlq_topic, dlq_partition, dlq_offset, letter_event_id, source_topic,
                                              source_partition, source_offset, value_from, redriven_by, forced)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, {forced})"""
        async with self._bookkeeping() as conn:
            claim: int | None = await conn.fetchval(insert.format(forced="false") + """
                ON CONFLICT (dlq_topic, dlq_partition, dlq_offset, letter_event_id) WHERE NOT forced
                DO NOTHING RETURNING id""", *args)
            if claim is None and force:
                claim = await conn.fetchval(insert.format(forced="true") + " RETURNING id", *args)
        return claim

    async def _settle(self, claim: int, offset: int | None) -> None:
        """Confirm a claimed re-drive at the copy's offset, or (None: the publish failed) withdraw it."""
        async with self._bookkeeping() as conn:
            if offset is None:
                await conn.execute("DELETE FROM dlq_redrives WHERE id = $1", claim)
            else:
                await conn.execute("UPDATE dlq_redrives SET status = 'published', target_offset = $2 WHERE id = $1",
                                   claim, offset)


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


def _already(row: Mapping[str, Any]) -> str:
    when = row["redriven_at"].isoformat(timespec="seconds")
    if row["status"] != "published":
        return (f"a re-drive started at {when} by {row['redriven_by']} did not confirm (it stopped before the "
                f"broker acknowledged?); check {row['source_topic']}[{row['source_partition']}], or --force")
    return (f"already re-driven at {when} to {row['source_topic']}[{row['source_partition']}]@"
            f"{row['target_offset']} (--force re-drives it again)")


def readable(data: bytes | None) -> str | None:
    """Bytes for a person: the text when they are UTF-8 without control characters, else ``base64:…``."""
    if data is None:
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in "\n\t" for c in text):
        return text
    return "base64:" + base64.b64encode(data).decode()


__all__ = ["REDRIVE_HEADER", "DeadLetters", "LetterDetails", "RedriveAction", "RedriveResult",
           "Rejected", "StoredLetter", "ValueFrom", "dead_letter", "is_outage", "publish_dead_letter", "readable",
           "size_budgets"]
