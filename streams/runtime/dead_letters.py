"""Dead letters that can always be sent: building them, and publishing them through outages.

A dead letter carries the record a service gave up on (value, key, headers) with the reason. A record
of about 1 MiB — or a larger one that the broker accepted compressed — would make a letter too large
for the broker, the letter's publish would fail, the service would stop, restart, meet the same record
again: a crash loop. So a letter is never larger than ``Settings.max_event_bytes``: ``dead_letter``
keeps a prefix of the value (and bounds the key, each header and the reason), records the original
value's size and SHA-256, and flags the letter ``truncated``. ``publish_dead_letter`` waits out a
broker outage (retriable errors, capped backoff, for as long as it lasts) and answers a refusal (a
non-retriable error, such as a size limit lower than ours) with a smaller letter.

This is the hot path the runtime and the services use. Working with letters afterwards (list, show,
re-drive, and the re-drive bookkeeping in PostgreSQL) is the operator's: ``agentstream.ops.dlq``, behind
``agentstream dlq list|show|redrive``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING

from aiokafka.errors import KafkaError

from agentstream.streams.core.events import DeadLetter, Event
from agentstream.streams.core.ids import utcnow
from agentstream.streams.core.outages import KAFKA, backoff, outage_of
from agentstream.streams.kafka.codec import Codec

if TYPE_CHECKING:
    from agentstream.streams.runtime.publisher import Runtime
    from agentstream.streams.runtime.records import Context

log = logging.getLogger(__name__)

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


__all__ = ["Rejected", "backoff_delay", "dead_letter", "is_outage", "publish_dead_letter", "refuse",
           "size_budgets"]
