"""A deterministic stand-in model for tests, benchmarks and replay: same conversation, same reply.

It reads directives from the task (the first user message) and plays them one per model step:

- ``[[tool:NAME {json arguments}]]`` — call a tool;
- ``[[retrieve:QUERY]]`` — search the documents;
- ``[[answer:TEXT]]`` — answer;
- ``[[garbage]]`` — reply with text that is not an action (the planner must cope);
- ``[[slow:MS]]`` — take MS milliseconds over the next reply.

Without directives, a task holding an arithmetic expression ("What is 17 * 23?") gets a calculator call
and then an answer quoting the result; any other task gets an answer that echoes it. Once the directives
are used up, the reply is an answer quoting the last tool or retrieval result.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncGenerator

from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest

_DIRECTIVE = re.compile(r"\[\[(tool|retrieve|answer|garbage|slow)(?::(.*?))?\]\]", re.S)
_ARITHMETIC = re.compile(r"[-+(]*\d[\d.\s]*(?:[-+*/%^][\s(]*[-+]?\d[\d.\s]*\)*)+")


def scripted_reply(messages: tuple[ChatMessage, ...]) -> tuple[str, float]:
    """The reply to a conversation, and the seconds to take over it."""
    task = next((m.content for m in messages if m.role == "user"), "")
    step = sum(1 for m in messages if m.role == "assistant")
    last_result = next((m.content for m in reversed(messages) if m.role == "tool"), None)
    plan: list[tuple[str, str]] = [(k, (a or "").strip()) for k, a in _DIRECTIVE.findall(task)]
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
        if kind == "retrieve":
            return json.dumps({"action": "retrieve", "query": arg}), delay
        if kind == "answer":
            return json.dumps({"action": "final_answer", "answer": arg}), delay
        return "I am not sure what to do next.", delay
    if last_result is not None:
        return json.dumps({"action": "final_answer", "answer": f"Based on the last step: {last_result}"}), delay
    return json.dumps({"action": "final_answer", "answer": f"You asked: {task}"}), delay


class ScriptedBackend:
    """``scripted_reply`` as a backend: no engine, ``slots`` replies at once, optional fixed latency."""

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
            if self.latency_s + delay:
                await asyncio.sleep(self.latency_s + delay)
            ttft_ms = (time.perf_counter() - started) * 1000
            step = self.chunk_chars or len(text) or 1
            for i in range(0, len(text), step):
                if i and self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                yield Delta(text[i : i + step])
            prompt_tokens = sum(len(m.content.split()) for m in request.messages)
            yield Final(text=text, finish_reason="stop", prompt_tokens=prompt_tokens,
                        completion_tokens=len(text.split()), ttft_ms=ttft_ms, model="scripted")
        finally:
            self.active -= 1
