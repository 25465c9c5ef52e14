"""What the planner asks the model for: one structured action, and how a reply becomes one.

Engines enforce the schema (llama.cpp grammar, ``response_format`` on OpenAI-compatible servers,
guided decoding in TensorRT-LLM); the parser still accepts a reply wrapped in prose or code fences,
and reports precisely what is wrong with one that is not an action.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agentstream.streams.core.errors import ActionError
from agentstream.streams.core.kinds import ActionKind
from agentstream.streams.core.tools import ToolInfo

MAX_ANSWER_CHARS = 2000
MAX_QUERY_CHARS = 300


def action_schema(tools: list[ToolInfo]) -> dict[str, Any]:
    """The JSON schema of one action for a run: one branch per allowed tool (with that tool's own
    argument schema), one for retrieval, one for the answer. Engines that enforce schemas (llama.cpp
    grammars, guided decoding) then cannot emit a call to a tool the run may not use, or a call with
    arguments of the wrong shape; even a small model's output stays usable."""
    branches: list[dict[str, Any]] = [
        {"type": "object", "additionalProperties": False, "required": ["action", "tool", "arguments"],
         "properties": {"action": {"const": "tool"}, "tool": {"const": t.name},
                        "arguments": {**(t.parameters or {"type": "object"}), "additionalProperties": False}}}
        for t in tools
    ]
    branches.append({"type": "object", "additionalProperties": False, "required": ["action", "query"],
                     "properties": {"action": {"const": "retrieve"},
                                    "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS}}})
    branches.append({"type": "object", "additionalProperties": False, "required": ["action", "answer"],
                     "properties": {"action": {"const": "final_answer"},
                                    "answer": {"type": "string", "minLength": 1, "maxLength": MAX_ANSWER_CHARS}}})
    return {"anyOf": branches}


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    query: str | None = None
    answer: str | None = None


def instructions(tools: list[ToolInfo], system_prompt: str | None = None) -> str:
    """The system message: what an action looks like, with a concrete example per tool (small models
    copy examples far better than they fill in placeholders)."""
    lines = [system_prompt.strip(), ""] if system_prompt else []
    lines += ["You are an agent that solves the user's task step by step.",
              "Each reply is exactly one JSON object, one of:"]
    for tool in tools:
        lines.append(f"- {json.dumps({'action': 'tool', 'tool': tool.name, 'arguments': _example(tool)})}"
                     f" calls {tool.name}: {tool.description}")
    lines.append('- {"action": "retrieve", "query": "kafka log compaction"} searches the documents.')
    lines.append('- {"action": "final_answer", "answer": "Paris is the capital of France."} gives the answer.')
    lines.append("Use a tool when it helps. When a tool has returned what you need, give the final answer.")
    if any(t.name == "calculator" for t in tools):
        lines += ["Example:", "Task: What is 12 * 3?",
                  '{"action": "tool", "tool": "calculator", "arguments": {"expression": "12 * 3"}}',
                  "calculator returned: 36", '{"action": "final_answer", "answer": "12 * 3 = 36"}']
    return "\n".join(lines)


def _example(tool: ToolInfo) -> dict[str, Any]:
    """Plausible example arguments from the tool's schema."""
    samples: dict[str, Any] = {"string": "12 * 3" if tool.name == "calculator" else "text", "integer": 1,
                               "number": 1.5, "boolean": True, "array": [], "object": {}}
    props = (tool.parameters or {}).get("properties", {})
    return {name: (spec.get("enum") or [samples.get(spec.get("type"), "value")])[0] for name, spec in props.items()}


def parse_action(text: str) -> Action:
    """The action in ``text``; raises ``ActionError`` saying what is wrong."""
    obj = _first_json_object(text)
    action = obj.get("action")
    if action == "final_answer":
        answer = obj.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            raise ActionError('"final_answer" needs a non-empty string "answer"')
        return Action("final_answer", answer=answer.strip())
    if action == "tool":
        tool, arguments = obj.get("tool"), obj.get("arguments", {})
        if not isinstance(tool, str) or not tool:
            raise ActionError('"tool" needs the tool\'s name in "tool"')
        if not isinstance(arguments, dict):
            raise ActionError('"arguments" must be a JSON object')
        return Action("tool", tool=tool, arguments=arguments)
    if action == "retrieve":
        query = obj.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ActionError('"retrieve" needs a non-empty string "query"')
        return Action("retrieve", query=query.strip())
    raise ActionError(f'"action" must be one of tool, retrieve, final_answer (got {action!r})')


def _first_json_object(text: str) -> dict[str, Any]:
    start = text.find("{")
    if start < 0:
        raise ActionError("the reply contains no JSON object")
    decoder = json.JSONDecoder()
    while start >= 0:
        try:
            obj, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            return obj
        start = text.find("{", start + 1)
    raise ActionError("the reply's JSON does not parse")
