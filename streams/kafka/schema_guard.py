"""Which writer schemas a reader agrees to learn: compatible evolutions of its own events, and nothing
that can make decoding cost more than the record's size.

A schema learnt from the schemas topic (``streams/kafka/schema_log.py``) or fetched from a registry decides how
the next records are read, and whoever may write that topic chooses it. Issue 37, finding 2: a
``TaskSubmitted`` writer schema with an extra ``array<null>`` field, then a 146-byte record claiming 2^62
items, and fastavro skipped the zero-byte items one at a time on the planner's event loop — years of CPU,
deaf to SIGTERM, again after every restart. So a learnt schema must:

- be a named record of an agentstream event (``EVENT_TYPES``) — nothing else is ever decoded;
- resolve to this process's reader schema of that event by the Avro specification's rules (every reader
  field the writer lacks has a default; promotions only int → long → float → double, string ↔ bytes;
  enum symbols and union branches that can resolve): a compatible evolution, not a different event
  under a known name;
- have no array whose items can encode in zero bytes (``null``, a ``fixed`` of size 0, a record whose
  fields all can), so that every item consumes at least one byte of the record and a claimed count can
  never run past the record's end (map entries always hold a key, at least one byte);
- be small (``MAX_SCHEMA_BYTES``) and shallow (``MAX_DEPTH``), so checking it is cheap too.

The rules are about the schema alone: the records written with it are then bounded by their own size
(Kafka's ``max.message.bytes``), whatever they claim.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The JSON of a schema an agentstream event needs is a few KB; a learnt one may be this large at most.
MAX_SCHEMA_BYTES = 64 * 1024
#: Nesting of types within types (records, arrays, maps, unions).
MAX_DEPTH = 32

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
#: The least number of bytes each primitive encodes in (varints and lengths take one at least).
_MIN_BYTES = {"null": 0, "boolean": 1, "int": 1, "long": 1, "float": 4, "double": 8, "bytes": 1, "string": 1}
#: Writer type -> reader types it resolves to (the specification's promotions, and itself).
_PROMOTIONS = {"int": {"int", "long", "float", "double"}, "long": {"long", "float", "double"},
               "float": {"float", "double"}, "string": {"string", "bytes"}, "bytes": {"bytes", "string"}}


class SchemaRefused(ValueError):
    """A writer schema a reader does not learn, and why."""


def check_writer(writer: Mapping[str, Any], reader: Mapping[str, Any] | None, *, size: int | None = None) -> None:
    """Raise ``SchemaRefused`` unless ``writer`` (a parsed schema: fastavro's ``parse_schema``, names
    fully qualified) may be learnt as a version of ``reader`` (this process's current schema of the
    same record; None: the record is not one of its events). ``size``: the schema's JSON in bytes."""
    if size is not None and size > MAX_SCHEMA_BYTES:
        raise SchemaRefused(f"the schema is {size} bytes; the limit is {MAX_SCHEMA_BYTES}")
    if writer.get("type") != "record":
        raise SchemaRefused("not a record schema")
    if reader is None:
        raise SchemaRefused(f"{writer.get('name')} is not an agentstream event")
    names = _Names()
    names.collect(writer, 0)
    for path, item in names.arrays:
        if names.min_bytes(item) == 0:
            raise SchemaRefused(f"the items of the array at {path} can encode in zero bytes: a count could "
                                "exceed the record's size")
    readers = _Names()
    readers.collect(reader, 0)
    problem = _Resolution(names, readers).problem(writer, reader, str(writer.get("name")))
    if problem:
        raise SchemaRefused(f"not a compatible version of {reader.get('name')}: {problem}")


class _Names:
    """A schema's named types by full name, and where its arrays are (for the zero-byte rule)."""

    def __init__(self) -> None:
        self.named: dict[str, Mapping[str, Any]] = {}
        self.arrays: list[tuple[str, Any]] = []
        self._sizes: dict[str, int] = {}

    def collect(self, schema: Any, depth: int, path: str = "") -> None:
        if depth > MAX_DEPTH:
            raise SchemaRefused(f"types nested deeper than {MAX_DEPTH} levels")
        if isinstance(schema, list):
            for branch in schema:
                self.collect(branch, depth + 1, path)
            return
        if not isinstance(schema, Mapping):
            return  # a primitive, or a reference to a named type collected where it was defined
        kind = schema.get("type")
        if kind in ("record", "error", "enum", "fixed"):
            name = str(schema.get("name"))
            if name in self.named:
                return
            self.named[name] = schema
            path = name
        if kind in ("record", "error"):
            for f in schema.get("fields", ()):
                self.collect(f.get("type"), depth + 1, f"{path}.{f.get('name')}")
        elif kind == "array":
            self.arrays.append((path or "the top", schema.get("items")))
            self.collect(schema.get("items"), depth + 1, path + "[]")
        elif kind == "map":
            self.collect(schema.get("values"), depth + 1, path + "{}")
        elif isinstance(kind, (list, Mapping)):
            self.collect(kind, depth + 1, path)

    def resolve(self, schema: Any) -> Any:
        """A named type's definition for a reference to it (else the schema itself)."""
        if isinstance(schema, str) and schema not in _PRIMITIVES:
            return self.named.get(schema, schema)
        if isinstance(schema, Mapping) and isinstance(schema.get("type"), (str, list, Mapping)) \
                and schema.get("type") not in ("record", "error", "enum", "fixed", "array", "map"):
            return self.resolve(schema["type"])  # {"type": "string"} and the like
        return schema

    def min_bytes(self, schema: Any, visiting: frozenset[str] = frozenset()) -> int:
        schema = self.resolve(schema)
        if isinstance(schema, str):
            return _MIN_BYTES.get(schema, 1)
        if isinstance(schema, list) or not isinstance(schema, Mapping):
            return 1  # a union's branch index
        kind = schema.get("type")
        if kind == "fixed":
            return int(schema.get("size", 0))
        if kind in ("record", "error"):
            name = str(schema.get("name"))
            if name in visiting:
                return 1  # a recursive record: it cannot encode without a union, which takes a byte
            if name not in self._sizes:
                self._sizes[name] = sum(self.min_bytes(f.get("type"), visiting | {name})
                                        for f in schema.get("fields", ()))
            return self._sizes[name]
        return 1  # enum index, array or map block count


class _Resolution:
    """The Avro specification's schema resolution, as a check rather than at decode time."""

    def __init__(self, writers: _Names, readers: _Names) -> None:
        self.writers = writers
        self.readers = readers
        self._done: set[tuple[str, str]] = set()

    def problem(self, writer: Any, reader: Any, path: str) -> str | None:
        w, r = self.writers.resolve(writer), self.readers.resolve(reader)
        if isinstance(r, list):
            if isinstance(w, list):  # every writer branch must resolve to some reader branch
                for branch in w:
                    if self.problem(branch, r, path) is not None:
                        return f"{path}: the writer's branch {_kind(branch, self.writers)} matches no reader branch"
                return None
            if any(self.problem(w, branch, path) is None for branch in r):
                return None
            return f"{path}: {_kind(w, self.writers)} matches no branch of the reader's union"
        if isinstance(w, list):
            # Resolvable only where the branch written resolves: each branch must, or a record could fail.
            for branch in w:
                if self.problem(branch, r, path) is not None:
                    return f"{path}: the writer's union has {_kind(branch, self.writers)}, the reader " \
                           f"{_kind(r, self.readers)}"
            return None
        wk, rk = _kind(w, self.writers), _kind(r, self.readers)
        if isinstance(w, str) and isinstance(r, str):
            return None if r in _PROMOTIONS.get(w, {w}) else f"{path}: {w} cannot be read as {r}"
        if wk != rk:
            return f"{path}: {wk} cannot be read as {rk}"
        assert isinstance(w, Mapping) and isinstance(r, Mapping)
        if wk == "array":
            return self.problem(w.get("items"), r.get("items"), path + "[]")
        if wk == "map":
            return self.problem(w.get("values"), r.get("values"), path + "{}")
        if not _same_name(w, r):
            return f"{path}: {wk} {w.get('name')} is not {r.get('name')}"
        if wk == "fixed":
            return None if w.get("size") == r.get("size") else f"{path}: fixed of another size"
        if wk == "enum":
            missing = set(w.get("symbols", ())) - set(r.get("symbols", ()))
            return None if not missing or "default" in r else f"{path}: symbols {sorted(missing)} unknown to the reader"
        key = (str(w.get("name")), str(r.get("name")))
        if key in self._done:
            return None  # a recursive record, already being checked
        self._done.add(key)
        return self._record(w, r, path)

    def _record(self, w: Mapping[str, Any], r: Mapping[str, Any], path: str) -> str | None:
        written = {f["name"]: f for f in w.get("fields", ())}
        for field in r.get("fields", ()):
            source = next((written[n] for n in (field["name"], *field.get("aliases", ())) if n in written), None)
            if source is None:
                if "default" not in field:
                    return f"{path}.{field['name']}: the writer lacks it and the reader has no default"
                continue
            problem = self.problem(source["type"], field["type"], f"{path}.{field['name']}")
            if problem:
                return problem
        return None


def _kind(schema: Any, names: _Names) -> str:
    schema = names.resolve(schema)
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    kind = schema.get("type") if isinstance(schema, Mapping) else None
    return "record" if kind == "error" else str(kind)


def _same_name(w: Mapping[str, Any], r: Mapping[str, Any]) -> bool:
    """Named types match by full name or by one of the reader's aliases (unqualified names compared too)."""
    wn, rn = str(w.get("name")), str(r.get("name"))
    aliases: Iterable[str] = r.get("aliases", ())
    return wn == rn or wn in aliases or wn.rsplit(".", 1)[-1] in {rn.rsplit(".", 1)[-1], *aliases}


__all__ = ["MAX_DEPTH", "MAX_SCHEMA_BYTES", "SchemaRefused", "check_writer"]
