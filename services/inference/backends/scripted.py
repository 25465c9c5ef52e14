"""A deterministic stand-in model for tests, benchmarks and replay: same conversation, same reply.

It reads directives from the task (the first user message) and plays them one per model step:

- ``[[tool:NAME {json arguments}]]`` — call a tool;
- ``[[tools:NAME {json} | NAME {json} | ...]]`` — call several tools at once (one ``tools`` action);
- ``[[retrieve:QUERY]]`` — search the documents;
- ``[[answer:TEXT]]`` — answer;
- ``[[garbage]]`` — reply with text that is not an action (the planner must cope);
- ``[[slow:MS]]`` — take MS milliseconds over the next reply;
- ``[[recall]]`` — answer with the answers of the session's earlier turns (``recall: a | b``), after the
  session's summary if it has one (``recall: [summary] a | b``).

A request to summarise a session's oldest turns (services/planner/summaries.py: its system message ends
``Reply with the summary only.``) gets ``earlier: a, b``: the earlier summary's answers and the folded
turns' answers, in order.

A task without directives plays those of the system message (an agent definition's system prompt: a
sub-agent's task is whatever its parent's model wrote). A turn of a session starts at its task, the last user message with directives; the earlier turns'
messages before it are its transcript.

Without directives, a task holding an arithmetic expression ("What is 17 * 23?") gets a calculator call
and then an answer quoting the result; any other task gets an answer that echoes it. Once the directives
are used up, the reply is an answer quoting the last tool or retrieval result (every result of the last
step's calls, in order, when it made several).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncGenerator

from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.streams.core.events import ToolCall

_DIRECTIVE = re.compile(r"\[\[(tools|tool|retrieve|answer|garbage|slow|recall)(?::(.*?))?\]\]", re.S)
#: Between two calls of a ``tools`` directive: a bar before the next tool's name and its arguments.
_NEXT_CALL = re.compile(r"\s*\|\s*(?=[A-Za-z_][\w.-]*\s*\{)")
_SUMMARISE = "Reply with the summary only."
_SUMMARY = re.compile(r"Summary of the conversation before the turns below: (.*)\Z", re.S)
_ARITHMETIC = re.compile(r"[-+(]*\d[\d.\s]*(?:[-+*/%^][\s(]*[-+]?\d[\d.\s]*\)*)+")


def scripted_reply(messages: tuple[ChatMessage, ...]) -> tuple[str, float]:
    """The reply to a conversation, and the seconds to take over it."""
    if messages and messages[0].role == "system" and messages[0].content.endswith(_SUMMARISE):
        return _summary(messages[-1].content), 0.0
    summary = _SUMMARY.search(messages[0].content) if messages and messages[0].role == "system" else None
    earlier, messages = _this_turn(messages)
    task = next((m.content for m in messages if m.role == "user"), "")
    step = sum(1 for m in messages if m.role == "assistant")
    last_result = next((m.content for m in reversed(messages) if m.role == "tool"), None)
    after = len(messages) - next((i for i, m in enumerate(reversed(messages)) if m.role == "assistant"), len(messages))
    results = [m.content for m in messages[after:] if m.role == "tool"]
    if len(results) > 1:  # the results of several calls at once
        last_result = " | ".join(results)
    plan: list[tuple[str, str]] = [(k, (a or "").strip()) for k, a in _DIRECTIVE.findall(task)]
    if not plan and messages and messages[0].role == "system":  # an agent's own script (its system prompt)
        plan = [(k, (a or "").strip()) for k, a in _DIRECTIVE.findall(messages[0].content)]
    delay = 0.0
    actions: list[tuple[str, str]] = []
    for kind, arg in plan:
        if kind == "slow":
            delay = float(arg or 0) / 1000
            continue
        actions.append((kind, arg))
    if not actions:
        match = _ARITHMETIC.search(task)
        if match and match.group().strip():
            actions = [("tool", "calculator " + json.dumps({"expression": match.group().strip()}))]
    if step < len(actions):
        kind, arg = actions[step]
        if kind == "tool":
            name, _, raw = arg.partition(" ")
            return json.dumps({"action": "tool", "tool": name, "arguments": json.loads(raw or "{}")}), delay
        if kind == "tools":
            calls = []
            for part in _NEXT_CALL.split(arg):
                name, _, raw = part.strip().partition(" ")
                calls.append({"tool": name, "arguments": json.loads(raw or "{}")})
            return json.dumps({"action": "tools", "calls": calls}), delay
        if kind == "retrieve":
            return json.dumps({"action": "retrieve", "query": arg}), delay
        if kind == "recall":
            recalled = (f"[{summary.group(1)}] " if summary else "") + " | ".join(_answers(earlier))
            return json.dumps({"action": "final_answer", "answer": "recall: " + recalled}), delay
        if kind == "answer":
            return json.dumps({"action": "final_answer", "answer": arg}), delay
        return "I am not sure what to do next.", delay
    if last_result is not None:
        return json.dumps({"action": "final_answer", "answer": f"Based on the last step: {last_result}"}), delay
    return json.dumps({"action": "final_answer", "answer": f"You asked: {task}"}), delay


def _this_turn(messages: tuple[ChatMessage, ...]) -> tuple[tuple[ChatMessage, ...], tuple[ChatMessage, ...]]:
    """(the earlier turns of a session, this turn's conversation): this turn starts at the last user message
    with directives (a session's transcript comes before it; the planner's own notes have none). Without
    directives, the whole conversation is this turn."""
    start = next((i for i in range(len(messages) - 1, -1, -1)
                  if messages[i].role == "user" and _DIRECTIVE.search(messages[i].content)), None)
    if start is None:
        return (), messages
    return messages[:start], messages[:1] + messages[start:]


def _summary(prompt: str) -> str:
    """The scripted summary of a summarising request's prompt (see the module's docstring)."""
    parts = []
    for line in prompt.splitlines():
        if line.startswith("Earlier summary: earlier: "):
            parts.append(line.removeprefix("Earlier summary: earlier: "))
        elif line.startswith("Assistant: "):
            parts.append(line.removeprefix("Assistant: "))
    return "earlier: " + ", ".join(parts)


def _answers(messages: tuple[ChatMessage, ...]) -> list[str]:
    """The answers of the final replies among ``messages`` (``[[recall]]``: what earlier turns answered)."""
    found = []
    for m in messages:
        if m.role == "assistant":
            try:
                reply = json.loads(m.content)
            except ValueError:
                continue
            if isinstance(reply, dict) and reply.get("action") == "final_answer":
                found.append(str(reply.get("answer")))
    return found


def _until_stop(text: str, stops: tuple[str, ...]) -> str:
    """``text`` up to the first of the request's stop strings, as an engine ends its output there (the
    other settings, sampling and token caps, have nothing to act on in a scripted reply)."""
    cut = min((i for i in (text.find(stop) for stop in stops if stop) if i >= 0), default=len(text))
    return text[:cut]


def native_reply(messages: tuple[ChatMessage, ...], text: str) -> tuple[str, tuple[ToolCall, ...]]:
    """``text`` (a scripted reply) as a model with native tool calling gives it: a tool or tools action
    becomes its calls (ids ``call_{step}_{k}``, unique in the conversation) with no text, a final answer
    its answer text; anything else stays as it is."""
    try:
        action = json.loads(text)
    except json.JSONDecodeError:
        return text, ()
    if not isinstance(action, dict):
        return text, ()
    step = sum(1 for m in messages if m.role == "assistant")
    if action.get("action") in ("tool", "tools"):
        calls = action.get("calls") or [{"tool": action.get("tool"), "arguments": action.get("arguments", {})}]
        return "", tuple(ToolCall(id=f"call_{step}_{k}", name=str(c.get("tool")), arguments=json.dumps(c.get("arguments", {})))
                         for k, c in enumerate(calls))
    if action.get("action") == "final_answer":
        return str(action.get("answer", "")), ()
    return text, ()


class ScriptedBackend:
    """``scripted_reply`` as a backend: no engine, ``slots`` replies at once, optional fixed latency. A
    request with ``tools`` (native tool calling) is answered with the reply's calls (``native_reply``)."""

    name = "scripted"

    def __init__(self, *, slots: int = 64, latency_s: float = 0.0, chunk_chars: int = 0,
                 chunk_delay_s: float = 0.0) -> None:
        self.slots = slots
        self.latency_s = latency_s
        self.chunk_chars = chunk_chars
        self.chunk_delay_s = chunk_delay_s
        #: Generations running now, and the most ever at once (tests check the service's batching).
        self.active = 0
        self.max_active = 0

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta | Final, None]:
        started = time.perf_counter()
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            text, delay = scripted_reply(request.messages)
            text = _until_stop(text, request.stop)
            calls: tuple[ToolCall, ...] = ()
            if request.tools:
                text, calls = native_reply(request.messages, text)
            if self.latency_s + delay:
                await asyncio.sleep(self.latency_s + delay)
            ttft_ms = (time.perf_counter() - started) * 1000
            step = self.chunk_chars or len(text) or 1
            for i in range(0, len(text), step):
                if i and self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                yield Delta(text[i : i + step])
            prompt_tokens = sum(len(m.content.split()) for m in request.messages)
            yield Final(text=text, finish_reason="tool_calls" if calls else "stop", prompt_tokens=prompt_tokens,
                        completion_tokens=len(text.split()), ttft_ms=ttft_ms, model="scripted", tool_calls=calls)
        finally:
            self.active -= 1
