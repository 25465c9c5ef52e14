"""Avro encoding in the Confluent wire format: ``0x00 | schema id (4 bytes, big-endian) | Avro binary``.

Decoding resolves the writer's schema (found by id) to the reader's current schema, so events written
by older code decode with newer code. Anything that cannot become a valid event raises ``DecodeError``
with a ``kind`` the runtime puts on the dead-letter record: ``undecodable`` (not our wire format, or
Avro that does not parse), ``unknown_schema`` (an id no registry knows, or a record type we do not
handle), ``invalid`` (decodes, but breaks the envelope's rules).
"""

from __future__ import annotations

import io
import struct

import fastavro

from agentstream.streams.config import Settings
from agentstream.streams.errors import AgentStreamError
from agentstream.streams.events import EVENT_TYPES, Event
from agentstream.streams.kinds import DecodeErrorKind
from agentstream.streams.registry import HttpRegistry, LocalRegistry, Parsed, SchemaRegistry, UnknownSchema

MAGIC = 0
_HEADER = struct.Struct(">bI")


class DecodeError(AgentStreamError):
    def __init__(self, kind: DecodeErrorKind, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind: DecodeErrorKind = kind
        self.reason = reason


class Codec:
    """Encode events to bytes and back, with schema ids from ``registry``."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self.registry = registry
        self._writers: dict[type[Event], tuple[bytes, Parsed]] = {}

    def encode(self, event: Event) -> bytes:
        writer = self._writers.get(type(event))
        if writer is None:
            name = type(event).schema_name
            writer = (_HEADER.pack(MAGIC, self.registry.id_for(name)), self.registry.reader_schema(name))
            self._writers[type(event)] = writer
        header, schema = writer
        out = io.BytesIO()
        out.write(header)
        fastavro.schemaless_writer(out, schema, event.to_dict())
        return out.getvalue()

    def schema_id(self, data: bytes) -> int:
        if len(data) < _HEADER.size or data[0] != MAGIC:
            raise DecodeError("undecodable", "not in the Confluent wire format (no magic byte 0)")
        sid: int = _HEADER.unpack_from(data)[1]
        return sid

    def decode(self, data: bytes | None) -> Event:
        if not data:
            raise DecodeError("undecodable", "empty value")
        sid = self.schema_id(data)
        try:
            writer = self.registry.writer_schema(sid)
        except UnknownSchema as exc:
            raise DecodeError("unknown_schema", str(exc)) from exc
        name = writer["name"] if isinstance(writer, dict) else ""
        cls = EVENT_TYPES.get(name)
        if cls is None:
            raise DecodeError("unknown_schema", f"schema id {sid} is {name or 'not a record'}, not an agentstream event")
        try:
            reader = self.registry.reader_schema(name)
            datum = fastavro.schemaless_reader(io.BytesIO(memoryview(data)[_HEADER.size:]), writer, reader)
        except UnknownSchema as exc:
            raise DecodeError("unknown_schema", str(exc)) from exc
        except Exception as exc:  # fastavro raises many types on corrupt input
            raise DecodeError("undecodable", f"{type(exc).__name__}: {exc}") from exc
        if not isinstance(datum, dict):  # a record schema reads as a dict; anything else is not an event
            raise DecodeError("invalid", f"{name}: not a record")
        try:
            event = cls.from_dict(datum)
        except (TypeError, ValueError) as exc:
            raise DecodeError("invalid", f"{name}: {exc}") from exc
        problem = event.problem()
        if problem:
            raise DecodeError("invalid", f"{name}: {problem}")
        return event


def codec_for(settings: Settings) -> Codec:
    """The codec with the registry the settings name (HTTP when configured, else local)."""
    local = LocalRegistry()
    if settings.schema_registry_url:
        return Codec(HttpRegistry(settings.schema_registry_url, local))
    return Codec(local)
