"""The model backend interface every inference engine implements.

A backend turns one request into a stream of text deltas followed by exactly one ``Final`` record.
The inference service runs up to ``slots`` generations at once (the engine batches them: llama.cpp's
parallel slots, TensorRT-LLM's in-flight batching); cancelling the consuming task, or closing the
async iterator, aborts the generation and frees its slot.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentstream.streams.core.events import ToolCall


@dataclass(frozen=True, kw_only=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    name: str | None = None
    #: Native tool calling: an assistant message's calls, and the call a tool message answers.
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class GenerationRequest:
    request_id: str  # the step_id: stable across redeliveries
    messages: tuple[ChatMessage, ...]
    max_tokens: int = 256
    temperature: float = 0.0
    #: JSON schema the reply must satisfy (structured output); None for free text.
    response_schema: dict[str, Any] | None = None
    #: Requests of the same run share this key, so an engine can keep their common prefix cached.
    cache_key: str | None = None
    model: str | None = None
    #: Strings that end the output (the engine leaves them out of it).
    stop: tuple[str, ...] = ()
    #: Nucleus sampling and the sampling seed; None: the engine's own default.
    top_p: float | None = None
    seed: int | None = None
    #: Native tool calling: the run's tools as OpenAI function tools, for the engine to offer the model
    #: (its own form: ``tools`` of an OpenAI-compatible request, the chat template's tools); None: the
    #: JSON-action mode. A backend that cannot call tools natively refuses such a request.
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Delta:
    """Newly generated text (may be several tokens)."""

    text: str


@dataclass(frozen=True, kw_only=True)
class Final:
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled" | "error"
    prompt_tokens: int
    completion_tokens: int
    #: Prompt tokens served from the engine's prefix cache; None when the engine does not say (not 0:
    #: an unmeasured figure must not read as "nothing was reused").
    cached_prompt_tokens: int | None = 0
    ttft_ms: float = 0.0
    model: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Native tool calling: the calls the model made (its text may then be empty).
    tool_calls: tuple[ToolCall, ...] = ()


@runtime_checkable
class Backend(Protocol):
    name: str
    #: How many generations the engine runs at once; the service consumes with this concurrency.
    slots: int

    async def start(self) -> None:
        """Load the model. The service joins its consumer group only after this returns."""

    async def close(self) -> None:
        """Release the engine."""

    def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta | Final, None]:
        """Yield deltas, then one ``Final``. Raise ``BackendError`` on failure. An async generator: the
        service closes it (``aclose``) to abort a generation it no longer wants."""
        ...
