"""Reading OpenAI-style chat-completion stream chunks, which llama.cpp's server (in-process or over HTTP)
and every OpenAI-compatible server produce: text deltas in ``choices[].delta.content``, native tool calls
in ``choices[].delta.tool_calls`` (each call's pieces by ``index``: its id and name, then its arguments in
fragments to concatenate), the finish reason, usage (with ``prompt_tokens_details.cached_tokens``), and
llama.cpp's ``timings``."""

from __future__ import annotations

import time
from typing import Any

from agentstream.services.inference.backends.base import Final
from agentstream.streams.core.events import ToolCall


class ChatStream:
    """Accumulates one completion's chunks; ``feed`` returns the new text, ``final`` the closing record."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.parts: list[str] = []
        self.ttft_ms = 0.0
        self.finish: str | None = None
        self.model = ""
        self.usage: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}
        #: Native tool calls by index: [id, name, argument fragments].
        self.calls: dict[int, tuple[list[str], list[str], list[str]]] = {}

    @property
    def begun(self) -> bool:
        """Output has begun (text or a tool call): a retry would repeat it."""
        return bool(self.parts or self.calls)

    def feed(self, chunk: dict[str, Any]) -> list[str]:
        self.model = chunk.get("model") or self.model
        self.usage = chunk.get("usage") or self.usage
        self.timings = chunk.get("timings") or self.timings
        texts = []
        for choice in chunk.get("choices") or ():
            self.finish = choice.get("finish_reason") or self.finish
            delta = choice.get("delta") or choice.get("message") or {}
            for call in delta.get("tool_calls") or ():
                if not self.begun:
                    self.ttft_ms = (time.perf_counter() - self.started) * 1000
                ident, name, arguments = self.calls.setdefault(int(call.get("index", len(self.calls))), ([], [], []))
                function = call.get("function") or {}
                if call.get("id"):
                    ident[:] = [call["id"]]
                if function.get("name"):
                    name.append(function["name"])
                if function.get("arguments"):
                    arguments.append(function["arguments"])
            text = delta.get("content")
            if text:
                if not self.parts:
                    self.ttft_ms = (time.perf_counter() - self.started) * 1000
                self.parts.append(text)
                texts.append(text)
        return texts

    def final(self, *, model: str | None = None, finish_names: dict[str, str] | None = None,
              extra: dict[str, Any] | None = None) -> Final:
        """The Final record. A stream that ended without a finish reason was cut short: "cancelled".
        Token counts come from ``usage``, else from llama.cpp's ``timings``."""
        finish = self.finish or "cancelled"
        timings, usage = self.timings, self.usage
        details = usage.get("prompt_tokens_details") or {}
        return Final(
            text="".join(self.parts),
            finish_reason=(finish_names or {}).get(finish, finish),
            prompt_tokens=usage.get("prompt_tokens") or timings.get("prompt_n", 0) + timings.get("cache_n", 0),
            completion_tokens=usage.get("completion_tokens") or timings.get("predicted_n") or len(self.parts),
            cached_prompt_tokens=details.get("cached_tokens") or timings.get("cache_n", 0),
            ttft_ms=self.ttft_ms,
            model=model or self.model,
            extra=extra or {},
            tool_calls=self.tool_calls(),
        )

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The native tool calls, in index order (an id the server left out becomes ``call_{index}``)."""
        return tuple(ToolCall(id=ident[0] if ident else f"call_{index}", name="".join(name),
                              arguments="".join(arguments) or "{}")
                     for index, (ident, name, arguments) in sorted(self.calls.items()))
