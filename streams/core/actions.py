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
from agentstream.streams.core.structured import answer_schema, example
from agentstream.streams.core.tools import ToolInfo

#: A text answer's cap in the action schema: the default of ``AGENTSTREAM_MAX_ANSWER_CHARS``
#: (streams/config/generation.py), which the planner passes in.
MAX_ANSWER_CHARS = 2000
MAX_QUERY_CHARS = 300


def action_schema(tools: list[ToolInfo], max_calls: int = 1, *, max_answer_chars: int = MAX_ANSWER_CHARS,
                  output_schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON schema of one action for a run: one branch per allowed tool (with that tool's own
    argument schema), one for several calls at once when ``max_calls`` > 1 (at most that many), one for
    retrieval, one for the answer. Engines that enforce schemas (llama.cpp grammars, guided decoding)
    then cannot emit a call to a tool the run may not use, or a call with arguments of the wrong shape;
    even a small model's output stays usable. The answer is text of at most ``max_answer_chars``, or,
    for a run with an ``output_schema``, JSON of that schema (structured.py: ``answer_schema``)."""
    answer: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": max_answer_chars}
    definitions: dict[str, Any] = {}
    if output_schema is not None:
        answer, definitions = answer_schema(output_schema)
    branches: list[dict[str, Any]] = [
        {"type": "object", "additionalProperties": False, "required": ["action", "tool", "arguments"],
         "properties": {"action": {"const": "tool"}, "tool": {"const": t.name},
                        "arguments": {**(t.parameters or {"type": "object"}), "additionalProperties": False}}}
        for t in tools
    ]
    if tools and max_calls > 1:
        branches.append(_calls_branch(tools, max_calls))
    branches.append({"type": "object", "additionalProperties": False, "required": ["action", "query"],
                     "properties": {"action": {"const": "retrieve"},
                                    "query": {"type": "string", "minLength": 1, "maxLength": MAX_QUERY_CHARS}}})
    branches.append({"type": "object", "additionalProperties": False, "required": ["action", "answer"],
                     "properties": {"action": {"const": "final_answer"},
                                    "answer": answer}})
    return {"anyOf": branches, **definitions}


def _calls_branch(tools: list[ToolInfo], max_calls: int) -> dict[str, Any]:
    """``{"action": "tools", "calls": [{"tool", "arguments"}, ...]}``: 2 to ``max_calls`` calls that run
    side by side (one is the ``tool`` action)."""
    call = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["tool", "arguments"],
                       "properties": {"tool": {"const": t.name},
                                      "arguments": {**(t.parameters or {"type": "object"}),
                                                    "additionalProperties": False}}} for t in tools]}
    return {"type": "object", "additionalProperties": False, "required": ["action", "calls"],
            "properties": {"action": {"const": "tools"},
                           "calls": {"type": "array", "minItems": 2, "maxItems": max_calls, "items": call}}}


@dataclass(frozen=True)
class CallRequest:
    """One tool call a model reply asks for: the tool, its arguments and, from an engine's native tool
    calling, the id the model gave the call (None in the JSON-action mode)."""

    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    call_id: str | None = None


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    query: str | None = None
    answer: str | None = None
    #: The calls of a ``tools`` action, in the order the model gave them (two or more).
    calls: tuple[CallRequest, ...] = ()
    #: A structured final answer as the model gave it (any JSON value), for the planner's schema check.
    value: Any = None


def instructions(tools: list[ToolInfo], system_prompt: str | None = None, max_calls: int = 1, *,
                 output_schema: dict[str, Any] | None = None) -> str:
    """The system message: what an action looks like, with a concrete example per tool (small models
    copy examples far better than they fill in placeholders); with ``max_calls`` > 1, the action that
    asks for several calls at once; with an ``output_schema``, the JSON the answer must be."""
    lines = [system_prompt.strip(), ""] if system_prompt else []
    lines += ["You are an agent that solves the user's task step by step.",
              "Each reply is exactly one JSON object, one of:"]
    for tool in tools:
        lines.append(f"- {json.dumps({'action': 'tool', 'tool': tool.name, 'arguments': _example(tool)})}"
                     f" calls {tool.name}: {tool.description}")
    if tools and max_calls > 1:
        pair = [{"tool": t.name, "arguments": _example(t)} for t in (tools * 2)[:2]]
        lines.append(f"- {json.dumps({'action': 'tools', 'calls': pair})} makes up to {max_calls} "
                     "independent calls at once; you get every result before your next reply.")
    lines.append('- {"action": "retrieve", "query": "kafka log compaction"} searches the documents.')
    if output_schema is None:
        lines.append('- {"action": "final_answer", "answer": "Paris is the capital of France."} gives the answer.')
    else:
        shown = json.dumps({"action": "final_answer", "answer": example(output_schema)})
        lines += [f"- {shown} gives the answer. The answer is JSON (not a string) matching this JSON Schema:",
                  json.dumps(output_schema, separators=(",", ":"))]
    lines.append("Use a tool when it helps. When a tool has returned what you need, give the final answer.")
    if any(t.name == "calculator" for t in tools):
        lines += ["Example:", "Task: What is 12 * 3?",
                  '{"action": "tool", "tool": "calculator", "arguments": {"expression": "12 * 3"}}',
                  "calculator returned: 36", '{"action": "final_answer", "answer": "12 * 3 = 36"}'
                  if output_schema is None else '{"action": "final_answer", "answer": <JSON as the schema says>}']
    return "\n".join(lines)


def _example(tool: ToolInfo) -> dict[str, Any]:
    """Plausible example arguments from the tool's schema."""
    samples: dict[str, Any] = {"string": "12 * 3" if tool.name == "calculator" else "text", "integer": 1,
                               "number": 1.5, "boolean": True, "array": [], "object": {}}
    props = (tool.parameters or {}).get("properties", {})

    def sample(spec: Any) -> Any:
        if not isinstance(spec, dict):
            return "value"
        kind = spec.get("type")
        if isinstance(kind, list):  # ["string", "null"]: a nullable field, as zod-made schemas write them
            kind = next((k for k in kind if k != "null"), None)
        return (spec.get("enum") or [samples.get(kind, "value") if isinstance(kind, str) else "value"])[0]

    return {name: sample(spec) for name, spec in props.items()}


def parse_action(text: str, *, structured: bool = False) -> Action:
    """The action in ``text``; raises ``ActionError`` saying what is wrong. ``structured``: the run has an
    output schema, so a final answer may be any JSON value (``Action.value``; checked by the planner)."""
    obj = _first_json_object(text)
    action = obj.get("action")
    if action == "final_answer":
        answer = obj.get("answer")
        if structured and answer is not None and answer != "":
            text_answer = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
            return Action("final_answer", answer=text_answer, value=answer)
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
    if action == "tools":
        return _parse_calls(obj.get("calls"))
    if action == "retrieve":
        query = obj.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ActionError('"retrieve" needs a non-empty string "query"')
        return Action("retrieve", query=query.strip())
    raise ActionError(f'"action" must be one of tool, tools, retrieve, final_answer (got {action!r})')


def _parse_calls(calls: Any) -> Action:
    """A ``tools`` action's calls; a single call is the ``tool`` action (the same decision)."""
    if not isinstance(calls, list) or not calls:
        raise ActionError('"tools" needs a non-empty list "calls" of {"tool", "arguments"} objects')
    parsed: list[CallRequest] = []
    for number, call in enumerate(calls, 1):
        if not isinstance(call, dict):
            raise ActionError(f'call {number} of "calls" must be a JSON object with "tool" and "arguments"')
        tool, arguments = call.get("tool"), call.get("arguments", {})
        if not isinstance(tool, str) or not tool:
            raise ActionError(f'call {number} of "calls" needs the tool\'s name in "tool"')
        if not isinstance(arguments, dict):
            raise ActionError(f'the "arguments" of call {number} must be a JSON object')
        parsed.append(CallRequest(tool, arguments))
    if len(parsed) == 1:
        return Action("tool", tool=parsed[0].tool, arguments=parsed[0].arguments)
    return Action("tools", calls=tuple(parsed))


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
