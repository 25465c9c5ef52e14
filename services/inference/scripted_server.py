"""An OpenAI-compatible HTTP server that answers with ``scripted_reply``: the scripted model over the wire.

Why it exists: the chaos suite (``bench/chaos/chaos.py``) runs its inference workers with the ``openai`` backend
against a model server that is a process of its own, so the suite can kill it and start it again (an
outage the workers must wait out), while every reply stays deterministic and costs next to no CPU (the
CPU model is far too slow for hundreds of runs on two cores). It speaks exactly what
``services/inference/backends/openai_compat.py`` sends and expects:

- ``GET /v1/models``: ``{"object": "list", "data": [{"id": MODEL, ...}]}`` (the backend's start-up check,
  which also names the default model);
- ``POST /v1/chat/completions`` with ``"stream": true``: server-sent events, one ``chat.completion.chunk``
  per delta, a last choice chunk carrying ``finish_reason``, then, when ``stream_options.include_usage``
  is set, a chunk with ``usage`` and no choices, then ``data: [DONE]``. Without ``stream``: one
  ``chat.completion`` object with ``usage``;
- ``GET /health``: ``{"status": "ok", ...}`` with how many generations ran and are running.

The backend turns a ``tool`` message into a user turn ``"[NAME result] CONTENT"`` (see its docstring);
this server turns such turns back into tool messages, so ``scripted_reply`` sees the conversation the
in-process scripted backend would see and quotes the last tool result in its closing answer.
``response_format``, ``temperature``, ``stop`` and ``max_tokens`` are accepted and ignored: scripted
replies are valid actions and short. A request with ``tools`` (native tool calling) is answered as such a
model would: the scripted reply's calls as ``tool_calls`` (streamed as ``delta.tool_calls``: each call's id
and name, then its arguments in two fragments), ``finish_reason`` ``tool_calls``; an answer as its text. A ``[[slow:MS]]`` directive delays the first delta by MS; while it
waits, a streaming response sends SSE comments, so a client that went away (a cancelled generation) is
noticed and the generation stops, as a real engine frees the slot of an aborted request.

    python -m agentstream.services.inference.scripted_server --port 8000 [--host 127.0.0.1] [--model scripted]
                                                 [--latency-ms 0] [--chunk-chars 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from agentstream.services.inference.backends.base import ChatMessage
from agentstream.services.inference.backends.scripted import native_reply, scripted_reply
from agentstream.streams.core.events import ToolCall

DEFAULT_MODEL = "scripted"
#: Characters per streamed delta: several deltas per reply, so token streaming is exercised.
DEFAULT_CHUNK_CHARS = 16
#: How often a streaming response that is waiting out a ``[[slow:MS]]`` writes a keep-alive comment: the
#: write is what reveals a client that disconnected, so this bounds how long an aborted generation lingers.
KEEPALIVE_S = 0.5
_TOOL_TURN = re.compile(r"\[(?P<name>[^\]\s]+) result\] (?P<content>.*)", re.S)


@dataclass(kw_only=True)
class ServerConfig:
    model: str = DEFAULT_MODEL
    #: Added to every reply before its first delta (on top of any ``[[slow:MS]]``).
    latency_s: float = 0.0
    chunk_chars: int = DEFAULT_CHUNK_CHARS


@dataclass
class Counters:
    """What ``/health`` reports: a test or the chaos suite can see the server is the one it started."""

    served: int = 0
    active: int = 0
    aborted: int = 0
    started_at: float = 0.0


class BadRequest(Exception):
    """The request body is not a chat completion request; the message says why (HTTP 400)."""


def _content(value: Any) -> str:
    """A message's text: a string, or OpenAI's list of content parts (their ``text`` joined)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(part.get("text", "") for part in value if isinstance(part, dict))
    if value is None:
        return ""
    raise BadRequest("a message's content must be a string or a list of parts")


def to_messages(raw: Any) -> tuple[ChatMessage, ...]:
    """The request's messages as the scripted model sees them: a user turn after the first one that
    reads ``"[NAME result] …"`` is the backend's rendering of a tool message, so it becomes one again."""
    if not isinstance(raw, list) or not raw:
        raise BadRequest("'messages' must be a non-empty list")
    messages: list[ChatMessage] = []
    seen_user = False
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise BadRequest("each message must be an object with a 'role'")
        role, content = item["role"], _content(item.get("content"))
        match = _TOOL_TURN.fullmatch(content) if role == "user" and seen_user else None
        if match:
            messages.append(ChatMessage(role="tool", name=match["name"], content=match["content"]))
            continue
        messages.append(ChatMessage(role=role, content=content, name=item.get("name")))
        seen_user = seen_user or role == "user"
    return tuple(messages)


def usage(messages: tuple[ChatMessage, ...], text: str) -> dict[str, Any]:
    """Token counts as the in-process scripted backend counts them (words), in OpenAI's shape."""
    prompt = sum(len(m.content.split()) for m in messages)
    completion = len(text.split())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0}}


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "code": status}},
                             status=status)


class ScriptedServer:
    """The aiohttp application: routes, the per-request reply, and the counters."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        self.counters = Counters(started_at=time.time())

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # conversations grow; poison is large
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        c = self.counters
        return web.json_response({"status": "ok", "model": self.config.model, "served": c.served,
                                  "active": c.active, "aborted": c.aborted,
                                  "uptime_s": round(time.time() - c.started_at, 3)})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.config.model, "object": "model", "created": int(self.counters.started_at),
             "owned_by": "agentstream"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            messages = to_messages(body.get("messages"))
        except (ValueError, BadRequest) as exc:
            return _error(400, f"bad request: {exc}")
        text, delay = scripted_reply(messages)
        calls: tuple[ToolCall, ...] = ()
        if body.get("tools"):
            text, calls = native_reply(messages, text)
        model = body.get("model") or self.config.model
        self.counters.active += 1
        try:
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(request, messages, text, delay, model, include_usage, calls)
            await asyncio.sleep(self.config.latency_s + delay)
            return web.json_response(self._completion(messages, text, model, calls))
        except asyncio.CancelledError:
            self.counters.aborted += 1
            raise
        finally:
            self.counters.active -= 1
            self.counters.served += 1

    def _completion(self, messages: tuple[ChatMessage, ...], text: str, model: str,
                    calls: tuple[ToolCall, ...] = ()) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text or None if calls else text}
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [{"index": 0, "message": message,
                                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": usage(messages, text)}

    async def _stream(self, request: web.Request, messages: tuple[ChatMessage, ...], text: str, delay: float,
                      model: str, include_usage: bool, calls: tuple[ToolCall, ...] = ()) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            await self._wait(resp, self.config.latency_s + delay)
            await self._write_reply(resp, messages, text, model, include_usage, calls)
        except ConnectionResetError:  # the client went away: the generation is aborted, quietly
            self.counters.aborted += 1
        return resp

    async def _write_reply(self, resp: web.StreamResponse, messages: tuple[ChatMessage, ...], text: str,
                           model: str, include_usage: bool, calls: tuple[ToolCall, ...] = ()) -> None:
        chunk_id, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            payload = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": choices, **extra}
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        step = max(1, self.config.chunk_chars)
        for i in range(0, len(text), step):
            delta: dict[str, Any] = {"content": text[i:i + step]}
            if i == 0:
                delta["role"] = "assistant"
            await resp.write(event([{"index": 0, "delta": delta, "finish_reason": None}]))
        for k, call in enumerate(calls):  # as OpenAI streams them: id and name first, the arguments in pieces
            half = len(call.arguments) // 2
            first = {"index": k, "id": call.id, "type": "function", "function": {"name": call.name, "arguments": ""}}
            await resp.write(event([{"index": 0, "delta": {"role": "assistant", "tool_calls": [first]},
                                     "finish_reason": None}]))
            for piece in (call.arguments[:half], call.arguments[half:]):
                await resp.write(event([{"index": 0, "delta": {"tool_calls": [
                    {"index": k, "function": {"arguments": piece}}]}, "finish_reason": None}]))
        await resp.write(event([{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else "stop"}]))
        if include_usage:
            await resp.write(event([], usage=usage(messages, text)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()

    @staticmethod
    async def _wait(resp: web.StreamResponse, seconds: float) -> None:
        """Sleep ``seconds``, writing SSE comments meanwhile (clients skip them): a write to a client that
        went away raises, which ends this generation like an engine aborting a cancelled request."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            await asyncio.sleep(min(left, KEEPALIVE_S))
            if end - time.monotonic() > 0:
                await resp.write(b": waiting\n\n")


async def serve(host: str, port: int, config: ServerConfig) -> None:
    """Serve until SIGINT/SIGTERM; print the address first (``--port 0`` picks a free port)."""
    runner = web.AppRunner(ScriptedServer(config).app(), handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    print(f"scripted model server listening on http://{host}:{bound}/v1 (model {config.model})", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (printed)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="the id /v1/models lists")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="added before every reply's first delta")
    parser.add_argument("--chunk-chars", type=int, default=DEFAULT_CHUNK_CHARS, help="characters per delta")
    args = parser.parse_args()
    config = ServerConfig(model=args.model, latency_s=args.latency_ms / 1000, chunk_chars=args.chunk_chars)
    asyncio.run(serve(args.host, args.port, config))


if __name__ == "__main__":
    main()
