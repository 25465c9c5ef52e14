"""Client backend for any OpenAI-compatible chat server: trtllm-serve, NVIDIA Dynamo's frontend, vLLM, NIM,
llama.cpp's server.

Why a client and not an engine: on GPU machines the engine is a separate, independently scaled server (it
batches the ``slots`` concurrent requests this service sends it), so this backend only speaks the protocol
(``/v1/chat/completions`` with ``"stream": true``, server-sent events). Choices that keep it portable:

* In the JSON-action mode a ``tool`` message becomes a user turn ``"[name result] content"``: OpenAI's API
  and several chat templates (Mistral's, for one) reject a ``tool`` message that is not the answer to an
  assistant ``tool_calls`` entry with its ``tool_call_id``, which that mode never produces. llama.cpp's
  server accepts a bare ``tool`` role, but small ChatML models have never seen it.
* Native tool calling (a request with ``tools``): the tools go out as ``tools`` with ``tool_choice: "auto"``
  (and no ``response_format``), assistant messages keep their ``tool_calls`` and tool results are ``tool``
  messages with their ``tool_call_id``; the reply's calls are read from the stream's
  ``delta.tool_calls`` (chat_stream.py).
* ``cache_key`` is not sent: these servers cache prefixes by content (vLLM, TensorRT-LLM and Dynamo's KV
  routing, llama.cpp's slots), and not every server accepts extra request fields.
* Retries happen only before the first delta: after that the caller holds partial output and must decide.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp

from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.chat_stream import ChatStream
from agentstream.streams.config.masking import mask_url
from agentstream.streams.core.errors import BackendError

log = logging.getLogger(__name__)
_FINISH = {"abort": "cancelled", "cancelled": "cancelled"}  # vLLM's engine calls an aborted request "abort"


class _Retry(Exception):
    """A failure before any output that another attempt may cure; ``delay`` overrides the backoff."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


def _message(message: ChatMessage) -> dict[str, Any]:
    if message.role == "tool" and message.tool_call_id is not None:
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.role == "tool":
        return {"role": "user", "content": f"[{message.name or 'tool'} result] {message.content}"}
    if message.tool_calls:
        return {"role": message.role, "content": message.content or None,
                "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in message.tool_calls]}
    return {"role": message.role, "content": message.content}


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date), capped at a minute."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), 60.0)


def _error_text(payload: Any) -> str:
    """The human part of an OpenAI-style error (``{"error": {"message": ...}}``), else the raw body."""
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            return payload.strip()[:500]
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    return str(error.get("message") or error) if isinstance(error, dict) else str(error)


async def _events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """Decoded ``data:`` payloads of a server-sent event stream, up to ``[DONE]``."""
    buffer = b""
    async for data in resp.content.iter_any():
        *lines, buffer = (buffer + data).split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):  # skips blank separators, ":" keep-alives, "event:" lines
                if (payload := line[5:].strip()) == b"[DONE]":
                    return
                yield json.loads(payload)


class OpenAIBackend:
    """Streams chat completions from an OpenAI-compatible server over one pooled HTTP session."""

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        slots: int = 8,
        connect_timeout_s: float = 5,
        read_timeout_s: float = 120,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        start_timeout_s: float = 10,
    ) -> None:
        """``read_timeout_s`` is the longest silence between bytes, not a cap on the reply; ``max_retries``
        counts attempts after the first; ``start_timeout_s`` is how long ``start()`` waits for a server
        that is still coming up (raise it for engines that load large models)."""
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.base_url, self.model, self.api_key, self.slots = base_url.rstrip("/"), model, api_key, slots
        self.connect_timeout_s, self.read_timeout_s = connect_timeout_s, read_timeout_s
        self.max_retries, self.backoff_s, self.start_timeout_s = max_retries, backoff_s, start_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._responses: set[aiohttp.ClientResponse] = set()

    async def start(self) -> None:
        """Open the session and check the server answers ``GET /models`` (which also names the default
        model when none was given). Connection errors and 5xx are retried for ``start_timeout_s``."""
        if self._session is not None:
            return
        session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.api_key}"} if self.api_key else {},
            # Twice the slots: a cancelled stream's connection may still be closing when the next one opens.
            connector=aiohttp.TCPConnector(limit=2 * self.slots),
            timeout=aiohttp.ClientTimeout(sock_connect=self.connect_timeout_s, sock_read=self.read_timeout_s),
        )
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                timeout = aiohttp.ClientTimeout(total=self.connect_timeout_s + 5)
                async with session.get(f"{self.base_url}/models", timeout=timeout) as resp:
                    text = await resp.text()
                    if resp.status == 200:
                        body = json.loads(text)
                        break
                    problem = f"HTTP {resp.status}: {_error_text(text)}"
                    if resp.status < 500:
                        deadline = 0  # 401/404: waiting will not help
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
            if time.monotonic() >= deadline:
                await session.close()
                raise BackendError(f"OpenAI-compatible server at {mask_url(self.base_url)} is not usable: {problem}")
            await asyncio.sleep(0.25)
        if self.model is None:
            models = [m.get("id") for m in body.get("data") or () if m.get("id")]
            if not models:
                await session.close()
                raise BackendError(f"{mask_url(self.base_url)}/models lists no model and none was configured")
            self.model = models[0]
        self._session = session

    async def close(self) -> None:
        """Close the session; streams still running end with ``finish_reason="cancelled"``."""
        session, self._session = self._session, None
        for resp in list(self._responses):  # wakes their readers with a connection error
            resp.close()
        if session is not None:
            await session.close()

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": request.model or self.model, "messages": [_message(m) for m in request.messages],
            "max_tokens": request.max_tokens, "temperature": request.temperature,
            "stream": True, "stream_options": {"include_usage": True},
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.top_p is not None:
            body["top_p"] = request.top_p
        if request.seed is not None:
            body["seed"] = request.seed
        if request.tools:
            body["tools"], body["tool_choice"] = request.tools, "auto"
        elif request.response_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "action", "schema": request.response_schema, "strict": True},
            }
        return body

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta | Final, None]:
        """Stream one completion. Closing or cancelling this iterator closes the HTTP response, which makes
        the server abort the generation and free its batch slot."""
        session = self._session
        if session is None:
            raise BackendError("OpenAI backend is not started", retriable=True)
        body, url = self._body(request), f"{self.base_url}/chat/completions"
        stream, problem = ChatStream(), ""  # ttft counts from the first attempt
        for attempt in range(self.max_retries + 1):
            resp: aiohttp.ClientResponse | None = None
            complete, delay = False, None
            try:
                try:
                    resp = await session.post(url, json=body)
                    self._responses.add(resp)
                    if resp.status != 200:
                        problem = f"HTTP {resp.status}: {_error_text(await resp.text())}"
                        if resp.status == 429 or resp.status >= 500:
                            raise _Retry(problem, _retry_after(resp.headers.get("Retry-After")))
                        raise BackendError(f"{mask_url(self.base_url)} rejected the request: {problem}")
                    async for chunk in _events(resp):
                        if "error" in chunk:
                            problem = f"server error in stream: {_error_text(chunk)}"
                            if stream.begun:
                                raise BackendError(problem, retriable=True)
                            raise _Retry(problem)
                        for text in stream.feed(chunk):
                            yield Delta(text)
                    if stream.finish is None:
                        raise aiohttp.ClientPayloadError("the stream ended without a finish_reason")
                    complete = True
                except (aiohttp.ClientError, TimeoutError) as exc:
                    if self._session is not session:  # close() cut the stream short
                        stream.finish = "cancelled"
                    elif stream.begun:
                        raise BackendError(f"stream broke after output began: {exc!r}", retriable=True) from exc
                    else:
                        raise _Retry(f"{type(exc).__name__}: {exc}") from exc
                except ValueError as exc:  # a chunk that is not JSON
                    raise BackendError(f"malformed stream from {mask_url(self.base_url)}: {exc}", retriable=True) from exc
            except _Retry as retry:
                problem = str(retry)
                if attempt == self.max_retries:
                    break
                delay = retry.delay if retry.delay is not None else self.backoff_s * 2**attempt
            finally:
                if resp is not None:
                    self._responses.discard(resp)
                    # An unfinished response must drop its connection: that is what aborts the generation.
                    (resp.release if complete else resp.close)()
            if delay is not None:
                log.warning("request %s attempt %d failed (%s); retrying in %.2fs",
                            request.request_id, attempt + 1, problem, delay)
                await asyncio.sleep(delay)
                continue
            yield stream.final(model=stream.model or body["model"] or "", finish_names=_FINISH,
                               extra={"attempts": attempt + 1})
            return
        raise BackendError(f"{mask_url(url)} failed after {self.max_retries + 1} attempts: {problem}", retriable=True)
