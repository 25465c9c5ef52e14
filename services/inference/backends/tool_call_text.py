"""Tool calls in a model's raw output, for engines that hand back text only (TensorRT-LLM's LLM API: the
chat template renders the tools, but nothing parses the calls).

The formats the common open models' templates teach them:

- Hermes / Qwen2.5 / Qwen3 / many fine-tunes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
  one block per call, possibly after some text;
- Llama 3.1 / 3.2 (JSON-based calls): the whole reply is ``{"name": ..., "parameters": {...}}`` (or
  ``"arguments"``), optionally after ``<|python_tag|>``.

Anything else is text: the final answer. Ids are made up (``call_{k}``): these models give none.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentstream.streams.core.events import ToolCall

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _call(obj: Any, k: int) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(id=f"call_{k}", name=obj["name"], arguments=json.dumps(arguments))


def structural_tag(tools: list[dict[str, Any]]) -> str:
    """The guided-decoding constraint for calls in the Hermes format (xgrammar's structural tag, as
    TensorRT-LLM's ``GuidedDecodingParams(structural_tag=...)`` takes it): output is free until the model
    writes ``<tool_call>``; from there it must be one of the run's tools, by name, with arguments that
    match that tool's schema, up to ``</tool_call>``. A model whose template teaches another format
    never writes the trigger, so the constraint costs it nothing."""
    structures = [{"begin": f'<tool_call>\n{{"name": {json.dumps(tool["function"]["name"])}, "arguments": ',
                   "schema": tool["function"].get("parameters") or {"type": "object"},
                   "end": "}\n</tool_call>"}
                  for tool in tools if tool.get("type") == "function" and "function" in tool]
    return json.dumps({"type": "structural_tag", "structures": structures, "triggers": ["<tool_call>"]})


def parse(text: str) -> tuple[str, tuple[ToolCall, ...]]:
    """``(content, calls)``: the reply's text without its call blocks, and its calls (none: an answer)."""
    blocks = _HERMES.findall(text)
    if blocks:
        calls: list[ToolCall] = []
        for block in blocks:
            try:
                call = _call(json.loads(block), len(calls))
            except json.JSONDecodeError:
                call = None
            if call is None:
                return text, ()  # a malformed block: the planner sees the text and says what is wrong
            calls.append(call)
        return _HERMES.sub("", text).strip(), tuple(calls)
    stripped = text.strip().removeprefix("<|python_tag|>").strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        try:
            call = _call(json.loads(stripped), 0)
        except json.JSONDecodeError:
            call = None
        if call is not None:
            return "", (call,)
    return text, ()


__all__ = ["parse", "structural_tag"]
