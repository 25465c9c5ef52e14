"""Native tool calling: the run's tools in the engines' own form, and a model reply's tool calls as an action.

Two ways for a model to call tools (``TaskSubmitted.tool_calling``):

- ``json`` (the default): the system message describes one JSON action per reply and the engine is held to
  the action's schema (streams/core/actions.py). Small models do better with it: they copy an example.
- ``native``: the engine's own tool calling. The request carries the run's tools as OpenAI function tools
  (``InferenceRequested.tools``); the engine renders them with the model's chat template and parses the
  model's calls into structured ``tool_calls`` (``InferenceCompleted.tool_calls``). An assistant message
  keeps its calls, and each tool result answers its call by id (``Message.tool_call_id``), as the engines'
  templates expect. A reply without calls is the final answer, as text. The planner's own retrieval action
  is not offered (the ``retrieve`` tool searches the documents).

Pure: no I/O; the planner (services/planner/machine.py) and the backends use it.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal, TypeAlias

from agentstream.streams.core.actions import Action, CallRequest
from agentstream.streams.core.errors import ActionError
from agentstream.streams.core.events import InferenceCompleted, Message
from agentstream.streams.core.tools import ToolInfo

ToolCalling: TypeAlias = Literal["native", "json"]
TOOL_CALLING: Final[tuple[ToolCalling, ...]] = ("native", "json")
DEFAULT: Final[ToolCalling] = "json"


def problem(value: object) -> str | None:
    """Why ``value`` is not a task's ``tool_calling`` (None, ``native`` or ``json``), or None."""
    if value is None or value in TOOL_CALLING:
        return None
    return f"tool_calling must be one of {', '.join(TOOL_CALLING)} (got {value!r})"


def function_tools(tools: list[ToolInfo]) -> list[dict[str, Any]]:
    """The tools as OpenAI function tools (``{"type": "function", "function": {name, description,
    parameters}}``): what OpenAI-compatible servers take as ``tools`` and chat templates render."""
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": t.parameters or {"type": "object", "properties": {}}}}
            for t in tools]


def native_instructions(tools: list[ToolInfo], system_prompt: str | None = None, max_calls: int = 1) -> str:
    """The system message in the native mode: the tools themselves travel in the request."""
    lines = [system_prompt.strip(), ""] if system_prompt else []
    lines.append("You are an agent that solves the user's task step by step.")
    if tools:
        lines.append("Call a tool when it helps" + (f" (up to {max_calls} calls at once when they are independent)"
                                                    if max_calls > 1 else " (one call per reply)")
                     + "; you get each result before your next reply.")
    lines.append("When you have what you need, reply with the final answer as plain text, without a tool call.")
    return "\n".join(lines)


def native_action(reply: InferenceCompleted, *, structured: bool = False) -> tuple[Message, Action]:
    """The assistant message (its calls kept, with their ids) and the action a native reply asks for: its
    tool calls (``tool``, or ``tools`` for several; each ``CallRequest`` carries the call's id), or, without
    calls, the final answer (its text; ``structured``: parsed as JSON when it is JSON). Raises
    ``ActionError`` for a call whose arguments are not a JSON object, or a reply with neither."""
    calls: list[CallRequest] = []
    for number, call in enumerate(reply.tool_calls, 1):
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError as exc:
            raise ActionError(f"the arguments of tool call {number} ({call.name}) are not JSON: {exc}") from None
        if not isinstance(arguments, dict):
            raise ActionError(f"the arguments of tool call {number} ({call.name}) must be a JSON object")
        if not call.name:
            raise ActionError(f"tool call {number} names no tool")
        calls.append(CallRequest(call.name, arguments, call_id=call.id or f"call_{number}"))
    said = Message(role="assistant", content=reply.text, tool_calls=list(reply.tool_calls))
    if len(calls) == 1:
        return said, Action("tool", tool=calls[0].tool, arguments=calls[0].arguments, calls=tuple(calls))
    if calls:
        return said, Action("tools", calls=tuple(calls))
    text = reply.text.strip()
    if not text:
        raise ActionError("the reply has neither a tool call nor an answer")
    value: Any = None
    if structured:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text  # the planner's schema check says what is wrong with it
    return said, Action("final_answer", answer=text, value=value)


def call_id_of(action: Action) -> str | None:
    """The id of a single native call (``tool`` action), None in the JSON-action mode."""
    return action.calls[0].call_id if action.kind == "tool" and action.calls else None


__all__ = ["DEFAULT", "TOOL_CALLING", "ToolCalling", "call_id_of", "function_tools", "native_action",
           "native_instructions", "problem"]
