"""Schema ids for the Confluent wire format: a local registry built from ``schemas/``, or an HTTP one.

The local registry needs no server and no coordination: a schema's id is a 31-bit hash of its Parsing
Canonical Form, so every process derives the same ids from the same files, and a changed schema gets a
new id. Files under ``schemas/history/`` are older versions kept so that old data still decodes. Schemas
other processes write with (a newer version, during a rolling upgrade) are learnt from the schemas topic
(``streams/kafka/schema_log.py``) when data with an id this process does not know arrives: ``learn``.

The HTTP registry speaks the Confluent Schema Registry API (``POST /subjects/{subject}/versions``,
``GET /schemas/ids/{id}``) with the record-name subject strategy, since one topic can carry several
event types (``agent.outcomes``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import fastavro
from fastavro.schema import to_parsing_canonical_form
from fastavro.types import Schema

from agentstream.streams.config.masking import mask_url
from agentstream.streams.core import resources
from agentstream.streams.core.errors import AgentStreamError, UnknownSchema
from agentstream.streams.kafka.schema_guard import MAX_SCHEMA_BYTES, SchemaRefused, check_writer

#: fastavro's parsed schema (for a record: a dict with fastavro's own annotations).
Parsed = Schema
#: A schema as written in a ``.avsc`` file (a JSON object).
RawSchema = dict[str, Any]


#: Schemas a process learns from the schemas topic at most. A rolling upgrade brings a version or two of a
#: few events; a flood of distinct compatible versions would otherwise grow a reader's memory without end.
MAX_LEARNT = 1000


class SchemaRegistry(Protocol):
    def id_for(self, name: str) -> int:
        """The id of the current schema of the record ``name`` (writers use it)."""

    def writer_schema(self, schema_id: int) -> Parsed:
        """The schema data with id ``schema_id`` was written with."""

    def reader_schema(self, name: str) -> Parsed:
        """The current schema of record ``name`` (readers resolve to it)."""


def schema_id(schema: RawSchema) -> int:
    canonical = to_parsing_canonical_form(fastavro.parse_schema(schema))
    return int.from_bytes(hashlib.sha256(canonical.encode()).digest()[:4], "big") & 0x7FFFFFFF


def full_name(schema: RawSchema) -> str:
    """A record schema's full name (``namespace.name`` unless the name is already qualified)."""
    name: str = schema["name"]
    return name if "." in name or not schema.get("namespace") else f"{schema['namespace']}.{name}"


class LocalRegistry:
    """Schemas from a directory: ``*.avsc`` are current, ``history/*.avsc`` are older versions."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = directory or resources.schemas_dir()
        self._by_id: dict[int, Parsed] = {}
        self._current: dict[str, tuple[int, Parsed]] = {}
        self._raw: dict[str, RawSchema] = {}
        #: Schemas learnt from elsewhere (``learn``), bounded by ``MAX_LEARNT``.
        self.learnt = 0
        for path in sorted(self.directory.glob("*.avsc")):
            self._add(json.loads(path.read_text()), current=True, origin=path)
        for path in sorted((self.directory / "history").glob("*.avsc")):
            self._add(json.loads(path.read_text()), current=False, origin=path)
        if not self._current:
            raise UnknownSchema(f"no *.avsc schemas in {self.directory}")

    def _add(self, raw: RawSchema, *, current: bool, origin: Path) -> None:
        sid = schema_id(raw)
        parsed = fastavro.parse_schema(raw)
        existing = self._by_id.get(sid)
        if existing is not None and to_parsing_canonical_form(existing) != to_parsing_canonical_form(parsed):
            raise UnknownSchema(f"schema id collision for {origin.name}: rename or change the schema")
        self._by_id[sid] = parsed
        if current:
            self._current[full_name(raw)] = (sid, parsed)
            self._raw[full_name(raw)] = raw

    def knows(self, schema_id: int) -> bool:
        """Whether data written with ``schema_id`` can be read (a current, older or learnt schema)."""
        return schema_id in self._by_id

    def learn(self, raw: RawSchema) -> int:
        """Know ``raw`` as a writer schema (not a current one: this process keeps writing with its own);
        return its id. Raises ``UnknownSchema`` when it does not parse, or when a reader may not learn it
        (``streams/kafka/schema_guard.py``: not a compatible version of one of this process's events, or a
        schema whose records could cost more to decode than their size)."""
        size = len(json.dumps(raw))
        if size > MAX_SCHEMA_BYTES:
            raise UnknownSchema(f"refused: the schema is {size} bytes; the limit is {MAX_SCHEMA_BYTES}")
        try:
            sid = schema_id(raw)
            parsed = fastavro.parse_schema(raw)
        except Exception as exc:  # fastavro raises many types for a schema it cannot parse
            raise UnknownSchema(f"not an Avro schema: {type(exc).__name__}: {exc}") from exc
        if sid not in self._by_id:
            if self.full:
                raise UnknownSchema(f"refused: {self.learnt} schemas were learnt already, the limit is {MAX_LEARNT} "
                                    "(a release has a few versions of each event: this is a flood; restart the "
                                    "process once the topic is cleaned up)")
            self._by_id[sid] = _guarded(parsed, self._current_schema, size)
            self.learnt += 1
        return sid

    @property
    def full(self) -> bool:
        """No more schemas are learnt (``MAX_LEARNT``)."""
        return self.learnt >= MAX_LEARNT

    def reader_name(self, raw: RawSchema) -> str | None:
        """The full name of the record ``raw`` defines, if this process has a current schema of it."""
        name = full_name(raw)
        return name if name in self._current else None

    def _current_schema(self, name: str) -> Parsed | None:
        current = self._current.get(name)
        return current[1] if current is not None else None

    def id_for(self, name: str) -> int:
        try:
            return self._current[name][0]
        except KeyError:
            raise UnknownSchema(f"no current schema for {name}") from None

    def writer_schema(self, schema_id: int) -> Parsed:
        try:
            return self._by_id[schema_id]
        except KeyError:
            raise UnknownSchema(f"unknown schema id {schema_id}") from None

    def reader_schema(self, name: str) -> Parsed:
        try:
            return self._current[name][1]
        except KeyError:
            raise UnknownSchema(f"no current schema for {name}") from None

    def names(self) -> list[str]:
        return sorted(self._current)

    def raw_current(self) -> dict[str, RawSchema]:
        """The current schemas as written in their files (what an HTTP registry is given)."""
        return dict(self._raw)


def _guarded(parsed: Parsed, current: Callable[[str], Parsed | None], size: int, sid: int | None = None) -> Parsed:
    """``parsed``, if a reader may learn it (``streams/kafka/schema_guard.py``: a compatible version of one of its
    events, nothing that makes decoding cost more than a record's size); else ``UnknownSchema`` saying why."""
    if not isinstance(parsed, dict):
        raise UnknownSchema("not a record schema")
    try:
        reader = current(str(parsed.get("name")))
        check_writer(parsed, reader if isinstance(reader, dict) else None, size=size)
    except SchemaRefused as exc:
        raise UnknownSchema(f"{'schema ' + str(sid) + ': ' if sid is not None else ''}refused: {exc}") from exc
    return parsed


class HttpRegistry:
    """A Confluent-compatible registry: our current schemas are registered (idempotent) at start-up;
    ids seen in data but not yet known are fetched once and cached."""

    def __init__(self, url: str, local: LocalRegistry | None = None, *, timeout: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.local = local or LocalRegistry()
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}
        self._by_id: dict[int, Parsed] = {}
        #: Ids whose schemas were refused (streams/kafka/schema_guard.py), with why.
        self._refused: dict[int, str] = {}
        for name, raw in self.local.raw_current().items():
            sid = int(self._request("POST", f"/subjects/{name}/versions", {"schema": json.dumps(raw)})["id"])
            self._ids[name] = sid
            self._by_id[sid] = self.local.reader_schema(name)

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                answer: dict[str, Any] = json.loads(resp.read())  # the registry's answers are JSON objects
                return answer
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise UnknownSchema(f"schema registry {mask_url(self.url)}{path}: not found") from exc
            raise AgentStreamError(f"schema registry {mask_url(self.url)}{path}: HTTP {exc.code}") from exc
        except OSError as exc:
            raise AgentStreamError(f"schema registry {mask_url(self.url)} unreachable: {exc}") from exc

    def id_for(self, name: str) -> int:
        try:
            return self._ids[name]
        except KeyError:
            raise UnknownSchema(f"no current schema for {name}") from None

    def writer_schema(self, schema_id: int) -> Parsed:
        cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        refused = self._refused.get(schema_id)
        if refused is not None:  # asked once: a record written with it costs no request
            raise UnknownSchema(refused)
        with self._lock:
            text = self._request("GET", f"/schemas/ids/{schema_id}")["schema"]
            try:
                try:
                    parsed = fastavro.parse_schema(json.loads(text))
                except Exception as exc:  # fastavro raises many types for a schema it cannot parse
                    raise UnknownSchema(f"schema {schema_id}: not an Avro schema: {type(exc).__name__}: {exc}") from exc
                self._by_id[schema_id] = _guarded(parsed, self.local._current_schema, len(text), schema_id)
            except UnknownSchema as exc:
                self._refused[schema_id] = str(exc)
                raise
            return self._by_id[schema_id]

    def reader_schema(self, name: str) -> Parsed:
        return self.local.reader_schema(name)

