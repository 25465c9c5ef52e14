"""An MCP tool's input schema and its result, in agentstream's terms.

Schema. agentstream puts a tool's parameters inside larger schemas: the JSON action the model must emit
(streams/core/actions.py embeds each tool's schema under ``arguments``) and the engines' native tool
definitions. A ``$ref`` to ``#/$defs/...`` (what pydantic writes for a nested model, so what many MCP
servers send) would then point at the wrong root, so ``parameters`` inlines local references and drops
``$defs`` and ``$schema``; a reference that recurses is cut to "any value" after a few levels; a list of
types becomes the equivalent ``anyOf`` (the prompts read a property's ``type`` as one name). The
arguments themselves are checked against the server's schema as sent (``ArgumentCheck``), with
jsonschema, before the call is claimed: a model's bad call is an ``invalid_arguments`` result, as for a
native tool, and never reaches the server.

Result. An MCP ``CallToolResult`` becomes the step's result (any JSON value) or its error:

- ``isError`` true: a ``ToolError`` whose message is the server's text, so the model is told (or the run
  fails, as its ``on_tool_error`` says);
- ``structuredContent`` present: that value, the data the server itself declares (its ``content`` is then
  by the spec only a rendering of it);
- else the ``content`` blocks: one text block is its text; anything else is a list with one item a
  block: text as a string, a resource link or an embedded text resource as an object with its URI, and
  binary data (images, audio, blobs) as an object saying its type, MIME type and size without the bytes,
  which would only fill the model's context with base64.
"""

from __future__ import annotations

import base64
import binascii
import copy
from typing import Any

import jsonschema
from mcp_types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
)
from referencing.exceptions import Unresolvable

from agentstream.streams.core.errors import ToolArgumentError, ToolError

#: How often one reference may be expanded inside itself before it becomes "any value".
_MAX_REF_DEPTH = 3


def parameters(input_schema: dict[str, Any]) -> dict[str, Any]:
    """``input_schema`` as agentstream registers it: local ``$ref``s inlined, ``$defs``/``definitions``
    and ``$schema`` dropped, an object at the root (``properties`` present, as the prompts read them), and
    a list of types (``["string", "null"]``, what zod-based servers write for a nullable field) as the
    equivalent ``anyOf``: the planner's prompt reads a property's ``type`` as one name."""
    schema = copy.deepcopy(input_schema)
    defs = {**schema.pop("definitions", {}), **schema.pop("$defs", {})}
    schema.pop("$schema", None)
    inlined = _inline(schema, defs, {})
    if not isinstance(inlined, dict):
        inlined = {}
    inlined.setdefault("type", "object")
    inlined.setdefault("properties", {})
    return inlined


def _inline(node: Any, defs: dict[str, Any], depth: dict[str, int]) -> Any:
    if isinstance(node, list):
        return [_inline(item, defs, depth) for item in node]
    if not isinstance(node, dict):
        return node
    kinds = node.get("type")
    if isinstance(kinds, list):  # {"type": ["string", "null"]} as the equivalent anyOf (see parameters)
        node = {k: v for k, v in node.items() if k != "type"}
        if len(kinds) == 1:
            node["type"] = kinds[0]
        elif "anyOf" not in node:
            node["anyOf"] = [{"type": kind} for kind in kinds]
        else:
            node["allOf"] = [*node.get("allOf", []), {"anyOf": [{"type": kind} for kind in kinds]}]
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/")):
        name = ref.rsplit("/", 1)[1]
        target = defs.get(name)
        if target is None or depth.get(name, 0) >= _MAX_REF_DEPTH:
            return {k: v for k, v in node.items() if k != "$ref"}  # unknown or recursing: any value
        inner = _inline(target, defs, {**depth, name: depth.get(name, 0) + 1})
        siblings = {k: _inline(v, defs, depth) for k, v in node.items() if k != "$ref"}
        return {**inner, **siblings} if isinstance(inner, dict) else inner
    return {k: _inline(v, defs, depth) for k, v in node.items()}


class ArgumentCheck:
    """Checks a call's arguments against the server's input schema (JSON Schema 2020-12, MCP's dialect).
    A schema jsonschema cannot use (invalid, or a remote ``$ref``) is checked only for being an object:
    the server checks its own arguments anyway; this check is for answering a model's mistake early."""

    def __init__(self, tool: str, input_schema: dict[str, Any]) -> None:
        self.tool = tool
        self._validator: jsonschema.protocols.Validator | None = None
        try:
            cls = jsonschema.validators.validator_for(input_schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(input_schema)
            self._validator = cls(input_schema)
        except jsonschema.SchemaError:
            self._validator = None

    def __call__(self, arguments: Any) -> dict[str, Any]:
        if not isinstance(arguments, dict):
            raise ToolArgumentError(f"{self.tool}: arguments must be a JSON object")
        if self._validator is None:
            return arguments
        try:
            error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        except Unresolvable:  # a reference it cannot follow: the server decides
            return arguments
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path)
            raise ToolArgumentError(f"{self.tool}: " + (f"argument {where!r}: " if where else "") + error.message)
        return arguments


def result_value(server: str, tool: str, result: CallToolResult) -> Any:
    """The step's result for ``result``, or ``ToolError`` when the server says the call failed."""
    if result.is_error:
        text = "; ".join(t for t in (_block_text(b) for b in result.content) if t) or "no details given"
        raise ToolError(f"MCP server {server!r} reported an error from {tool}: {text}")
    if result.structured_content is not None:
        return result.structured_content
    blocks = [_block(b) for b in result.content]
    if len(blocks) == 1 and isinstance(blocks[0], str):
        return blocks[0]
    return blocks


def _block_text(block: ContentBlock) -> str:
    value = _block(block)
    return value if isinstance(value, str) else ""


def _block(block: ContentBlock) -> Any:
    """One content block as the model should read it (binary data described, not copied)."""
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, ImageContent | AudioContent):
        return {"type": block.type, "mime_type": block.mime_type, "bytes": _decoded_size(block.data)}
    if isinstance(block, ResourceLink):
        return {"type": "resource_link", "uri": str(block.uri), "name": block.name,
                **({"description": block.description} if block.description else {})}
    if isinstance(block, EmbeddedResource):
        resource = block.resource
        if isinstance(resource, BlobResourceContents):
            return {"type": "resource", "uri": str(resource.uri), "mime_type": resource.mime_type,
                    "bytes": _decoded_size(resource.blob)}
        return {"type": "resource", "uri": str(resource.uri), "text": resource.text}
    return {"type": getattr(block, "type", "unknown")}  # a block type newer than this code


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)
