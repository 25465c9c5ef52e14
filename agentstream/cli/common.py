"""What the command modules share: the consoles they print to, the event loop they run on, and how a
value is shortened for a table cell."""

from __future__ import annotations

import json
from collections.abc import Coroutine
from typing import Any, TypeVar

from rich.console import Console

console = Console()
err = Console(stderr=True)
T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop (faster on the hot path) unless AGENTSTREAM_UVLOOP=0 or it is not
    installed (it comes with the [worker] extra; a client's commands run as well on asyncio's loop)."""
    import asyncio

    from agentstream.streams.config.env import uvloop_enabled

    if uvloop_enabled():
        try:
            import uvloop
        except ModuleNotFoundError:
            return asyncio.run(coro)
        return uvloop.run(coro)
    return asyncio.run(coro)


def short(value: object, limit: int = 70) -> str:
    """``value`` on one line of at most ``limit`` characters; of a step's result, what it says (its text, a
    tool's result), without the accounting."""
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in ("duration_ms", "prompt_tokens", "completion_tokens",
                                                           "cached_prompt_tokens", "ttft_ms", "replayed", "ok")}
        if set(value) >= {"text", "finish_reason"}:
            value = value["text"]
        elif "result" in value and "tool" in value:
            value = value["result"]
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def yes(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]no[/red]"
