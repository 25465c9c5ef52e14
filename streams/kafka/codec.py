"""Avro encoding in the Confluent wire format: ``0x00 | schema id (4 bytes, big-endian) | Avro binary``.

Decoding resolves the writer's schema (found by id) to the reader's current schema, so events written
by older code decode with newer code. Anything that cannot become a valid event raises ``DecodeError``
with a ``kind`` the runtime puts on the dead-letter record: ``undecodable`` (not our wire format, or
Avro that does not parse), ``unknown_schema`` (an id no registry knows, or a record type we do not
handle), ``invalid`` (decodes, but breaks the envelope's rules).

``decode`` knows the ids of this process's schema files (and of an HTTP registry); ``decode_async``, which
every consumer uses, also looks an unknown id up in the schemas topic (``streams/kafka/schema_log.py``) before
giving up on it, so that processes with different versions of a schema read each other's events (a
rolling upgrade, docs/upgrades.md).
"""

from __future__ import annotations

import io
import struct

import fastavro

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError, UnknownSchema
from agentstream.streams.core.events import EVENT_TYPES, Event
from agentstream.streams.kafka.registry import HttpRegistry, LocalRegistry, Parsed, SchemaRegistry
from agentstream.streams.kafka.schema_log import SchemaLog
from agentstream.streams.kafka.topics import Topics

MAGIC = 0
_HEADER = struct.Struct(">bI")


class Codec:
    """Encode events to bytes and back, with schema ids from ``registry``; with ``schemas`` (the local
    registry's schemas topic), ids of other processes' schemas are looked up there."""

    def __init__(self, registry: SchemaRegistry, schemas: SchemaLog | None = None) -> None:
        self.registry = registry
        self.schemas = schemas
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
            raise DecodeError("unknown_schema", str(exc), unknown_id=sid) from exc
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

    async def decode_async(self, data: bytes | None, *, raise_outages: bool = False) -> Event:
        """``decode``, but an id this process does not know is looked up in the schemas topic first (a
        newer or older process's schema: ``streams/kafka/schema_log.py``); only an id nobody published is
        ``unknown_schema``. A known id costs what ``decode`` costs. When the topic cannot be read (the
        broker is away), the broker's error is raised with ``raise_outages`` (the runtime waits it out),
        else the record is ``unknown_schema``."""
        try:
            return self.decode(data)
        except DecodeError as exc:
            if exc.unknown_id is None or self.schemas is None:
                raise
            unknown, sid = exc, exc.unknown_id
        if not await self._lookup(sid, unknown, raise_outages):
            raise unknown
        return self.decode(data)

    async def learn(self, data: bytes | None, *, raise_outages: bool = False) -> None:
        """Make sure the schema ``data`` was written with is known, if anyone published it (for code that
        reads the writer's schema itself, or decodes in a synchronous function afterwards)."""
        if self.schemas is None or not data or data[0] != MAGIC or len(data) < _HEADER.size:
            return
        sid = self.schema_id(data)
        if not self.schemas.registry.knows(sid):
            await self._lookup(sid, None, raise_outages)

    async def _lookup(self, sid: int, error: DecodeError | None, raise_outages: bool) -> bool:
        assert self.schemas is not None
        try:
            return await self.schemas.lookup(sid)
        except Exception as exc:
            if raise_outages:
                raise
            if error is None:
                return False
            raise DecodeError("unknown_schema", f"{error.reason}; the schemas topic could not be read "
                                                f"({type(exc).__name__}: {exc})", unknown_id=sid) from exc

    async def close(self) -> None:
        """Stop the schemas topic's consumer, if a lookup started one."""
        if self.schemas is not None:
            await self.schemas.close()


def codec_for(settings: Settings) -> Codec:
    """The codec with the registry the settings name: HTTP when configured, else local (from
    ``settings.schemas_dir``, or the package's schemas), with the schemas topic of the settings' prefix."""
    local = LocalRegistry(settings.schemas_dir)
    if settings.schema_registry_url:
        return Codec(HttpRegistry(settings.schema_registry_url, local))
    topic = Topics(prefix=settings.topic_prefix).schemas
    return Codec(local, SchemaLog(settings.kafka_bootstrap, topic, local, auth=settings.kafka_auth))
