"""Retry, timeout and error handling of the OpenAI-compatible backend, against a scripted in-process
aiohttp server (the happy path against a real server is in tests/integration/test_openai_backend.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from agentstream.devstack.process import free_port
from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.openai_compat import OpenAIBackend
from agentstream.streams.core.errors import BackendError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _chunk(content: str | None = None, finish: str | None = None, usage: dict | None = None) -> bytes:
    chunk: dict = {"model": "m", "choices": [] if usage else [{"index": 0, "delta": {"content": content},
                                                                "finish_reason": finish}]}
    if usage:
        chunk["usage"] = usage
    return f"data: {json.dumps(chunk)}\n\n".encode()


async def good(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for part in ("Hel", "lo"):
        await resp.write(_chunk(part))
    await resp.write(_chunk(finish="stop"))
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 5}}
    await resp.write(_chunk(usage=usage) + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def models(data: list[dict]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"data": data})
    return handler


def status(code: int, message: str = "nope", headers: dict[str, str] | None = None) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"code": code, "message": message}}, status=code, headers=headers)
    return handler


def stall(seconds: float) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(seconds)
        return resp
    return handler


async def breaks_after_one_delta(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk("partial"))
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()  # no terminating chunk: the client sees a truncated body
    return resp


class Scripted:
    """Answers the n-th chat request with the n-th handler (the last one repeats) and records them."""

    def __init__(self, *handlers: Handler) -> None:
        self.handlers = list(handlers)
        self.requests: list[dict] = []
        self.times: list[float] = []
        self.headers: list[dict[str, str]] = []

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        self.times.append(time.monotonic())
        self.headers.append(dict(request.headers))
        handler = self.handlers[min(len(self.requests), len(self.handlers)) - 1]
        return await handler(request)


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[tuple[Scripted, OpenAIBackend]]]]:
    servers: list[TestServer] = []
    backends: list[OpenAIBackend] = []

    async def make(*handlers: Handler, **kw) -> tuple[Scripted, OpenAIBackend]:
        script = Scripted(*handlers)
        app = web.Application()
        app.router.add_get("/v1/models", models([{"id": "m"}]))
        app.router.add_post("/v1/chat/completions", script.chat)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        kw = {"max_retries": 3, "backoff_s": 0.01, **kw}
        backend = OpenAIBackend(base_url=str(server.make_url("/v1")), **kw)
        await backend.start()
        backends.append(backend)
        return script, backend

    yield make
    for backend in backends:
        await backend.close()
    for server in servers:
        await server.close()


def _request(**kw) -> GenerationRequest:
    return GenerationRequest(request_id="r1", messages=(ChatMessage(role="user", content="hi"),), **kw)


async def _collect(backend: OpenAIBackend, **kw) -> list[Delta | Final]:
    return [item async for item in backend.generate(_request(**kw))]


async def test_good_stream_and_request_body(serve) -> None:
    script, backend = await serve(good, api_key="sk-test")
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    messages = (ChatMessage(role="user", content="q"), ChatMessage(role="tool", content="42", name="calc"))
    items = [i async for i in backend.generate(GenerationRequest(
        request_id="r", messages=messages, max_tokens=9, stop=("END",), response_schema=schema))]
    assert items[:-1] == [Delta("Hel"), Delta("lo")]
    final = items[-1]
    assert isinstance(final, Final)
    assert (final.text, final.finish_reason, final.model) == ("Hello", "stop", "m")
    assert (final.prompt_tokens, final.completion_tokens, final.cached_prompt_tokens) == (7, 2, 5)
    body = script.requests[0]
    assert body["model"] == "m" and body["max_tokens"] == 9 and body["stop"] == ["END"]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["messages"][1] == {"role": "user", "content": "[calc result] 42"}
    assert body["response_format"]["json_schema"] == {"name": "action", "schema": schema, "strict": True}
    assert script.headers[0]["Authorization"] == "Bearer sk-test"


async def test_503_twice_then_success(serve) -> None:
    script, backend = await serve(status(503), status(503), good)
    items = await _collect(backend)
    assert isinstance(items[-1], Final) and items[-1].text == "Hello"
    assert items[-1].extra["attempts"] == 3 and len(script.requests) == 3


async def test_400_is_not_retried(serve) -> None:
    script, backend = await serve(status(400, "Expected 'messages' to be an array"))
    with pytest.raises(BackendError, match="Expected 'messages' to be an array") as info:
        await _collect(backend)
    assert info.value.retriable is False and len(script.requests) == 1


async def test_retries_exhausted_is_retriable(serve) -> None:
    script, backend = await serve(status(500, "boom"), max_retries=2)
    with pytest.raises(BackendError, match="failed after 3 attempts: HTTP 500: boom") as info:
        await _collect(backend)
    assert info.value.retriable is True and len(script.requests) == 3


async def test_connection_refused_is_retried_then_retriable() -> None:
    backend = OpenAIBackend(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", max_retries=2,
                            backoff_s=0.05, start_timeout_s=0.3)
    with pytest.raises(BackendError, match="not usable") as info:
        await backend.start()
    assert info.value.retriable is False
    # Started against a server that then goes away: generate() retries, then gives up retriably.
    app = web.Application()
    app.router.add_get("/v1/models", models([]))
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    backend.base_url = str(server.make_url("/v1"))
    await backend.start()
    await server.close()
    try:
        started = time.monotonic()
        with pytest.raises(BackendError, match="failed after 3 attempts: ClientConnectorError") as info:
            await _collect(backend)
        assert info.value.retriable is True
        assert time.monotonic() - started >= 0.05 + 0.1  # two backoffs: 0.05 s, then 0.1 s
    finally:
        await backend.close()


async def test_stall_before_first_token_is_retried(serve) -> None:
    script, backend = await serve(stall(2.0), good, read_timeout_s=0.3)
    started = time.monotonic()
    items = await _collect(backend)
    assert isinstance(items[-1], Final) and items[-1].text == "Hello"
    assert len(script.requests) == 2 and time.monotonic() - started < 1.5


async def test_break_after_delta_is_not_retried(serve) -> None:
    script, backend = await serve(breaks_after_one_delta, good)
    seen: list[Delta | Final] = []
    with pytest.raises(BackendError, match="after output began") as info:
        async for item in backend.generate(_request()):
            seen.append(item)
    assert seen == [Delta("partial")]
    assert info.value.retriable is True and len(script.requests) == 1


async def test_retry_after_is_honoured(serve) -> None:
    script, backend = await serve(status(429, "slow down", {"Retry-After": "1"}), good)
    items = await _collect(backend)
    assert isinstance(items[-1], Final)
    assert len(script.requests) == 2 and script.times[1] - script.times[0] >= 0.95


async def test_aclose_drops_the_connection(serve) -> None:
    disconnected = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            while True:
                await resp.write(_chunk("x"))
                await asyncio.sleep(0.02)
        except (ConnectionError, asyncio.CancelledError):
            disconnected.set()
            raise

    _, backend = await serve(endless)
    stream = backend.generate(_request())
    assert await anext(stream) == Delta("x")
    await stream.aclose()
    await asyncio.wait_for(disconnected.wait(), 2)


async def test_close_ends_running_streams_as_cancelled(serve) -> None:
    _, backend = await serve(stall(5.0))
    task = asyncio.create_task(_collect(backend))
    await asyncio.sleep(0.2)
    await backend.close()
    items = await asyncio.wait_for(task, 2)
    assert isinstance(items[-1], Final) and items[-1].finish_reason == "cancelled"
