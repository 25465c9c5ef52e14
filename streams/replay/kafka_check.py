"""The Kafka cross-check of a run's timeline: is each recorded event still at its offset?

For every event row with a topic/partition/offset, the record is read back from Kafka and checked to
decode to the same ``event_id``: one consumer, offsets grouped per partition into spans, one seek per
span (records of other runs in between are skipped undecoded).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import TopicAuthorizationFailedError

from agentstream.streams.core.errors import DecodeError, UnknownSchema
from agentstream.streams.core.task_rules import MAX_EVENT_ID_CHARS
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.replay.records import EventInfo, KafkaCheck
from agentstream.streams.store.history import event_uuid

#: Offsets of one partition further apart than this are read as separate spans (one seek each).
SPAN_GAP = 500


async def cross_check(consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient, codec: Codec,
                      events: Sequence[EventInfo], *, timeout_s: float = 5.0) -> None:
    """Set ``kafka`` on every event: verified, missing (deleted topic, retention, compaction), mismatched
    (another event at that offset), or unrecorded (no offset in the row). ``consumer``: started, no group;
    ``admin``: started (it asks for the metadata of these topics only: a cluster may hold thousands)."""
    wanted: dict[TopicPartition, dict[int, EventInfo]] = defaultdict(dict)
    for e in events:
        if e.partition is None or e.offset is None:
            e.kafka = "unrecorded"
        else:
            wanted[TopicPartition(e.topic, e.partition)][e.offset] = e
    if not wanted:
        return
    described = await admin.describe_topics(sorted({tp.topic for tp in wanted}))
    existing = {d["topic"]: {p["partition"] for p in d["partitions"]} for d in described if d["error_code"] == 0}
    # A tenant's principal reads its cell's outcomes but not the services' topics (docs/security.md): those
    # events stay unchecked, said so, rather than reported missing.
    refused = {d["topic"] for d in described if d["error_code"] == TopicAuthorizationFailedError.errno}
    tps = []
    for tp, by_offset in wanted.items():
        if tp.topic in refused:
            _mark(by_offset.values(), "unchecked", "this principal may not read the topic")
        elif tp.partition in existing.get(tp.topic, ()):
            tps.append(tp)
        else:
            _mark(by_offset.values(), "missing", "the topic or partition no longer exists")
    if not tps:
        return
    # Assign before asking for offsets (the consumer then fetches metadata for these topics only), and
    # seek at once: fetching starts while the offsets are asked (one below the log start resets to it).
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, min(wanted[tp]))
    first, last = await asyncio.gather(consumer.beginning_offsets(tps), consumer.end_offsets(tps))
    spans: dict[TopicPartition, list[tuple[int, int]]] = {}
    for tp in tps:
        offsets = []
        for offset, e in wanted[tp].items():
            if offset < first[tp]:
                _mark([e], "missing", f"below the log start offset {first[tp]} (retention)")
            elif offset >= last[tp]:
                _mark([e], "missing", f"at or past the end offset {last[tp]}")
            else:
                offsets.append(offset)
        offsets.sort()
        runs: list[tuple[int, int]] = []
        for o in offsets:
            if runs and o - runs[-1][1] <= SPAN_GAP:
                runs[-1] = (runs[-1][0], o)
            else:
                runs.append((o, o))
        if runs:
            spans[tp] = runs
    if not spans:
        return
    for tp in tps:
        if tp not in spans:
            consumer.pause(tp)
        elif spans[tp][0][0] != min(wanted[tp]):
            consumer.seek(tp, spans[tp][0][0])
    deadline = time.monotonic() + timeout_s
    while spans and time.monotonic() < deadline:
        try:
            batch = await consumer.getmany(*spans, timeout_ms=100)
        except TopicAuthorizationFailedError as exc:  # may describe (it writes there), may not read
            named = [tp for tp in spans if not exc.args or tp.topic == exc.args[0]] or list(spans)
            for tp in named:
                _mark(wanted[tp].values(), "unchecked", "this principal may not read the topic")
                del spans[tp]
                consumer.pause(tp)
            continue
        for tp, messages in batch.items():
            by_offset = wanted[tp]
            for msg in messages:
                found = by_offset.get(msg.offset)
                if found is None or found.kafka != "unchecked":
                    continue
                try:
                    await codec.learn(msg.value)  # written by a process with another version of its schema
                    kind, got = _identify(codec, msg.value)
                except (DecodeError, UnknownSchema, ValueError, IndexError) as exc:
                    _mark([found], "mismatched", f"does not decode: {exc}")
                    continue
                if event_uuid(got) == found.event_id and kind == found.event_type:  # history keeps ids as UUIDs
                    _mark([found], "verified")
                else:
                    _mark([found], "mismatched", f"offset {msg.offset} holds {kind} {got}")
        for tp in list(spans):
            if await consumer.position(tp) > spans[tp][0][1]:
                spans[tp].pop(0)
                if spans[tp]:
                    consumer.seek(tp, spans[tp][0][0])
                else:
                    del spans[tp]
                    consumer.pause(tp)
    for by_offset in wanted.values():  # (an event left unchecked with a note was not this principal's to read)
        _mark([e for e in by_offset.values() if e.kafka == "unchecked" and not e.kafka_note], "missing",
              "not found at its offset (compacted, or not read in time)")


def _identify(codec: Codec, data: bytes | None) -> tuple[str, str]:
    """(event type, event id) of a record in our wire format. Every event's writer schema starts with
    ``event_id`` (a string: zig-zag varint length, UTF-8), so the id is read from the front of the
    Avro body instead of decoding whole conversations (a long run's model requests carry them all);
    a writer schema that does not start with it is decoded in full."""
    if not data:
        raise DecodeError("undecodable", "empty value")
    writer = codec.registry.writer_schema(codec.schema_id(data))
    name = str(writer.get("name", "")).rsplit(".", 1)[-1] if isinstance(writer, dict) else ""
    fields = writer.get("fields") if isinstance(writer, dict) else None
    if not fields or fields[0].get("name") != "event_id" or fields[0].get("type") != "string":
        event = codec.decode(data)
        return type(event).__name__, event.event_id
    pos, shift, raw = 5, 0, 0
    while True:
        byte = data[pos]
        raw |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            break
    length = (raw >> 1) ^ -(raw & 1)
    if not 0 < length <= 4 * MAX_EVENT_ID_CHARS or pos + length > len(data):  # UTF-8: up to 4 bytes a character
        raise ValueError(f"event_id length {length} out of range")
    return name, data[pos:pos + length].decode()


def _mark(events: Iterable[EventInfo], status: KafkaCheck, note: str = "") -> None:
    for e in events:
        e.kafka, e.kafka_note = status, note


__all__ = ["SPAN_GAP", "cross_check"]
