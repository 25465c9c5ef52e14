"""Structured output: a task's ``output_schema`` (a JSON Schema, as JSON text) and the answers checked against it.

Two places need the same rules, so they live here, below both: ``AgentClient.submit`` refuses a schema
that is not valid JSON Schema (``TaskRejected``), and the planner refuses one in a task published by other
means (``RunFailed(invalid_task)``, through ``task_rules.generation_problem``); the planner then checks
every final answer of such a run (``check_answer``). Guided decoding (llama.cpp's grammar, an
OpenAI-compatible server's ``response_format``, TensorRT-LLM's xgrammar) makes a valid answer likely, when
the engine enforces the schema at all: the check makes it certain.

Validation is the ``jsonschema`` library's, with the draft the schema's ``$schema`` names (2020-12 when it
names none) and its format checker. A ``$ref`` must point into the schema itself: nothing is fetched.
``jsonschema`` is imported on first use (a tenth of a second): most tasks have no output schema, and this
module is imported with every event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

#: An output schema's size limit (it travels in the task and in every model request of its run).
MAX_OUTPUT_SCHEMA_BYTES = 16 * 1024
#: How much of a validation error goes back to the model and into the run's error.
MAX_PROBLEM_CHARS = 500
#: Where ``$defs`` may be referenced from: the definitions move to the action schema's root with them.
_HOISTED = ("$defs", "definitions")


def load_schema(text: str | None) -> dict[str, Any] | None:
    """The output schema as a dict; None for no schema and for one that is not a JSON object (such a task
    is refused before its run starts: ``output_schema_problem``)."""
    if text is None:
        return None
    try:
        schema = json.loads(text)
    except ValueError:
        return None
    return schema if isinstance(schema, dict) else None


def output_schema_problem(text: Any) -> str | None:
    """Why ``text`` is not a usable output schema (not JSON text, not a JSON object, not valid JSON Schema
    for its draft, an unknown ``$schema``, a ``$ref`` that does not resolve within it), or None."""
    if text is None:
        return None
    if not isinstance(text, str):
        return f"output_schema must be JSON Schema as JSON text, not {type(text).__name__}"
    size = len(text.encode(errors="replace"))
    if size > MAX_OUTPUT_SCHEMA_BYTES:
        return f"the output schema is {size} bytes; the limit is {MAX_OUTPUT_SCHEMA_BYTES}"
    try:
        schema = json.loads(text)
    except ValueError as exc:
        return f"the output schema is not JSON: {exc}"
    if not isinstance(schema, dict):
        return "the output schema must be a JSON object (a JSON Schema such as {\"type\": \"object\", ...})"
    from jsonschema import exceptions as schema_errors
    from jsonschema.validators import Draft202012Validator, validator_for

    unknown = cast("type[Validator]", _UnknownDraft)
    if "$schema" in schema and (not isinstance(schema["$schema"], str)
                                or validator_for(schema, default=unknown) is unknown):
        return f"the output schema's $schema {schema['$schema']!r} names no JSON Schema draft jsonschema knows"
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except schema_errors.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        return f"the output schema is not valid JSON Schema: {_short(exc.message)}" + (f" (at {where})" if where else "")
    for ref in _refs(schema):
        problem = _ref_problem(schema, ref)
        if problem:
            return problem
    return None


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _ref_problem(schema: dict[str, Any], ref: str) -> str | None:
    """A ``$ref`` that leaves the schema (nothing is fetched) or points at nothing in it."""
    if not ref.startswith("#"):
        return f"the output schema's $ref {ref!r} points outside it; only references within it (#/...) are allowed"
    if not ref.startswith("#/") and ref != "#":
        return None  # an anchor (#name): the validator resolves it
    node: Any = schema
    for part in ref[2:].split("/") if ref != "#" else ():
        key = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return f"the output schema's $ref {ref!r} points at nothing in it"
    return None


def answer_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the final answer's ``answer`` gets in a run's action schema (``actions.action_schema``), and the
    definitions to put at that schema's root. The output schema is nested there, so its references must
    still resolve from the root: ``#/$defs/...`` and ``#/definitions/...`` do once the definitions move up
    with them. A schema with any other reference is not nested (``{}``: the engine leaves the answer's shape
    open, and the planner's check still holds it to the schema)."""
    refs = list(_refs(schema))
    if any(not ref.startswith(tuple(f"#/{k}/" for k in _HOISTED)) for ref in refs):
        return {}, {}
    nested = {k: v for k, v in schema.items() if k not in ("$schema", "$id", *_HOISTED)}
    return nested, {k: schema[k] for k in _HOISTED if k in schema}


@dataclass(frozen=True)
class CheckedAnswer:
    """A final answer held against the output schema: ``output`` (the answer as compact JSON text) when it
    is valid, else ``problem`` (what is wrong, short enough to hand back to the model)."""

    output: str | None
    problem: str | None = None


def check_answer(value: Any, schema: dict[str, Any]) -> CheckedAnswer:
    """Hold ``value`` (the ``answer`` of a final_answer action, any JSON value) against ``schema``. A string
    that is not valid as itself but holds JSON (a model without guided decoding that wrote the object as a
    string, maybe in a code fence) is checked as that JSON."""
    from jsonschema.validators import Draft202012Validator, validator_for

    try:
        validator_cls = validator_for(schema, default=Draft202012Validator)
        validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
        problem = _problem(validator, value)
        if problem is None:
            return _valid(value)
        if isinstance(value, str) and (parsed := _embedded_json(value)) is not None:
            again = _problem(validator, parsed[0])
            if again is None:
                return _valid(parsed[0])
            problem = again
    except Exception as exc:  # a schema the validator cannot apply (admission checks schemas; belt and braces)
        return CheckedAnswer(None, f"the output schema could not be applied: {_short(str(exc))}")
    return CheckedAnswer(None, problem)


def _problem(validator: Validator, instance: Any) -> str | None:
    from jsonschema import exceptions as schema_errors

    error = schema_errors.best_match(validator.iter_errors(instance))
    if error is None:
        return None
    where = error.json_path if error.path else ""
    return _short(error.message) + (f" (at {where})" if where else "")


def _valid(value: Any) -> CheckedAnswer:
    try:
        return CheckedAnswer(json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False))
    except ValueError:
        return CheckedAnswer(None, "the answer holds NaN or Infinity, which JSON does not have")


def _embedded_json(text: str) -> tuple[Any] | None:
    """The JSON value ``text`` holds (alone, or in a ``` fence), as a 1-tuple; None when it holds none."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0].strip()
    try:
        return (json.loads(body),)
    except ValueError:
        return None


def example(schema: Any, depth: int = 0) -> Any:
    """A plausible instance of ``schema`` for the model's instructions: small models copy an example's shape
    far better than they follow a schema. Not guaranteed valid (patterns, formats, bounds are not read)."""
    if not isinstance(schema, dict) or depth > 6:
        return "..."
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {name: example(spec, depth + 1) for name, spec in props.items()}
    if kind == "array":
        return [example(schema.get("items") or {}, depth + 1)]
    return {"string": "text", "integer": 1, "number": 1.5, "boolean": True, "null": None}.get(str(kind), "...")


class _UnknownDraft:
    """What ``validator_for`` returns here for a ``$schema`` it does not know (a marker, never used)."""


def _short(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM_CHARS else text[:MAX_PROBLEM_CHARS] + "…"


__all__ = ["MAX_OUTPUT_SCHEMA_BYTES", "CheckedAnswer", "answer_schema", "check_answer", "example", "load_schema",
           "output_schema_problem"]
