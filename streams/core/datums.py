"""Events and their nested records as plain dicts and back: the shape fastavro writes and reads.

Kept apart from the event types (``events.py``) because it is mechanism, not vocabulary, and it is the
hot path of every publish and every decode: the type information of each class (its field names, which
fields hold nested records) is computed once per class and cached.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any


def _is_record(hint: Any) -> bool:
    """A nested record is a dataclass (``Message``, ``ToolCall``, …); a field of any other type is a value."""
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def to_dict(obj: Any) -> dict[str, Any]:
    """Field values by name, nested records as dicts (type information is precomputed per class:
    this runs for every event published)."""
    cls: type = type(obj)
    data = {name: getattr(obj, name) for name in _names(cls)}
    for name, (shape, _record) in _nested(cls).items():
        value = data[name]
        if value is not None:
            data[name] = to_dict(value) if shape == "one" else [to_dict(v) for v in value]
    return data


@functools.cache
def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return tuple(dataclasses.fields(cls))


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in _fields(cls))


@functools.cache
def _nested(cls: type) -> dict[str, tuple[str, type]]:
    """Fields holding nested records: name -> ("one" | "list", record class)."""
    hints = typing.get_type_hints(cls)
    nested: dict[str, tuple[str, type]] = {}
    for f in _fields(cls):
        hint = hints[f.name]
        if _is_record(hint):
            nested[f.name] = ("one", hint)
        elif typing.get_origin(hint) is list and _is_record(typing.get_args(hint)[0]):
            nested[f.name] = ("list", typing.get_args(hint)[0])
    return nested


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    names = _names(cls)
    if len(data) == len(names) and all(name in data for name in names):
        return _from_datum(cls, data)
    known = set(names)
    values = {k: v for k, v in data.items() if k in known}
    for name, (shape, record) in _nested(cls).items():
        if name in values and values[name] is not None:
            raw = values[name]
            values[name] = from_dict(record, raw) if shape == "one" else [from_dict(record, r) for r in raw]
    return cls(**values)


def _from_datum(cls: type, data: dict[str, Any]) -> Any:
    """``data`` has exactly the class's fields (an Avro datum read with the class's own schema, which
    mirrors it): the object is made without the frozen dataclass's ``__init__``, which sets each field
    through ``object.__setattr__`` and cost more than half of decoding an event (18 µs of 29 for a model
    request). Nothing is lost: the fields have no ``__post_init__`` and no defaults to fill in."""
    values = dict(data)
    for name, (shape, record) in _nested(cls).items():
        raw = values[name]
        if raw is not None:
            values[name] = from_dict(record, raw) if shape == "one" else [from_dict(record, r) for r in raw]
    obj: Any = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


__all__ = ["from_dict", "to_dict"]
