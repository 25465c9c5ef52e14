"""The TensorRT-LLM backend against a stand-in ``tensorrt_llm`` package (no GPU, no network).

The fake mirrors the parts of the real LLM API the backend uses: ``LLM(**kwargs)``, ``llm.tokenizer
.apply_chat_template``, ``llm.generate_async(...)`` returning a ``RequestOutput``-like object that is
async-iterated step by step (the same object each step, with ``outputs[0].text_diff``), ``abort()``,
and the config classes, each recording the keyword arguments it was built with.
"""

from __future__ import annotations

import asyncio
import json
import sys
import types
from typing import Any

import pytest

from agentstream.services.inference.backends.base import (
    BackendError,
    ChatMessage,
    Delta,
    Final,
    GenerationRequest,
)
from agentstream.services.inference.backends.trtllm import TrtLlmBackend, chat_messages

HANG = object()  # a script step that never arrives (the engine is still computing)


class Recorded:
    """A config class that keeps its keyword arguments."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class FakeCompletion:
    def __init__(self) -> None:
        self.text = ""
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self._last = 0

    @property
    def text_diff(self) -> str:
        return self.text[self._last:]


class FakeResult:
    """One request: plays ``script`` steps of ``(text, n_tokens, finish_reason)``, ``HANG`` or an exception."""

    def __init__(self, script: list[Any], prompt_token_ids: list[int], cached_tokens: int) -> None:
        self.script = list(script)
        self.prompt_token_ids = prompt_token_ids
        self.cached_tokens = cached_tokens
        self.outputs = [FakeCompletion()]
        self.finished = False
        self.aborted = 0

    def abort(self) -> None:
        self.aborted += 1

    def __aiter__(self) -> FakeResult:
        return self

    async def __anext__(self) -> FakeResult:
        if self.finished:
            raise StopAsyncIteration
        step = self.script.pop(0)
        if step is HANG:
            await asyncio.Event().wait()
        if isinstance(step, Exception):
            raise step
        text, n_tokens, finish = step
        out = self.outputs[0]
        out._last = len(out.text)
        out.text += text
        out.token_ids += [7] * n_tokens
        if finish:
            out.finish_reason, self.finished = finish, True
        return self


class FakeTokenizer:
    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        self.calls.append((messages, kwargs))
        return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"


class Fake:
    """The ``tensorrt_llm`` stand-in and what it recorded."""

    def __init__(self) -> None:
        self.llm_kwargs: dict[str, Any] | None = None
        self.tokenizer = FakeTokenizer()
        self.calls: list[dict[str, Any]] = []
        self.results: list[FakeResult] = []
        self.script: list[Any] = [("Hel", 1, None), ("", 1, None), ("lo", 1, None), (" world", 2, "stop")]
        self.shutdowns = 0
        fake = self

        class LLM:
            def __init__(self, **kwargs: Any) -> None:
                fake.llm_kwargs = kwargs
                self.tokenizer = fake.tokenizer

            def generate_async(self, prompt: str, sampling_params: Any = None, streaming: bool = False):
                fake.calls.append({"prompt": prompt, "params": sampling_params, "streaming": streaming})
                result = FakeResult(fake.script, prompt_token_ids=list(range(11)), cached_tokens=8)
                fake.results.append(result)
                return result

            def shutdown(self) -> None:
                fake.shutdowns += 1

        policy = types.SimpleNamespace(MAX_UTILIZATION="MAX_UTILIZATION", GUARANTEED_NO_EVICT="GUARANTEED_NO_EVICT",
                                       STATIC_BATCH="STATIC_BATCH")
        self.llmapi = types.ModuleType("tensorrt_llm.llmapi")
        for name in ("KvCacheConfig", "SchedulerConfig", "GuidedDecodingParams", "EagleDecodingConfig",
                     "MTPDecodingConfig"):
            setattr(self.llmapi, name, type(name, (Recorded,), {}))
        self.llmapi.CapacitySchedulerPolicy = policy
        self.llm_args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
        self.llm_args.Eagle3DecodingConfig = type("Eagle3DecodingConfig", (Recorded,), {})
        self.llmapi.llm_args = self.llm_args
        self.package = types.ModuleType("tensorrt_llm")
        self.package.LLM = LLM
        self.package.SamplingParams = type("SamplingParams", (Recorded,), {})
        self.package.llmapi = self.llmapi

    @property
    def params(self) -> dict[str, Any]:
        return self.calls[-1]["params"].kwargs


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Fake:
    fake = Fake()
    monkeypatch.setitem(sys.modules, "tensorrt_llm", fake.package)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", fake.llmapi)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_args", fake.llm_args)
    return fake


def _request(**kw: Any) -> GenerationRequest:
    defaults: dict[str, Any] = dict(request_id="s1", max_tokens=200, messages=(
        ChatMessage(role="system", content="You plan."), ChatMessage(role="user", content="What is 2+2?")))
    return GenerationRequest(**(defaults | kw))


async def _collect(backend: TrtLlmBackend, request: GenerationRequest) -> tuple[list[str], Final]:
    items = [item async for item in backend.generate(request)]
    assert isinstance(items[-1], Final) and all(isinstance(i, Delta) for i in items[:-1])
    return [i.text for i in items[:-1]], items[-1]


async def test_llm_built_with_batching_kv_reuse_and_memory_fraction(fake: Fake) -> None:
    backend = TrtLlmBackend(model="Qwen/Qwen2.5-0.5B-Instruct", slots=32, max_num_tokens=4096,
                            free_gpu_memory_fraction=0.7, scheduler_policy="max_utilization",
                            speculative={"kind": "mtp", "num_nextn_predict_layers": 2})
    await backend.start()
    await backend.start()  # idempotent: one engine
    kw = fake.llm_kwargs
    assert kw is not None
    assert kw["model"] == "Qwen/Qwen2.5-0.5B-Instruct" and kw["max_batch_size"] == 32
    assert kw["max_num_tokens"] == 4096 and kw["tensor_parallel_size"] == 1
    assert kw["kv_cache_config"].kwargs == {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.7}
    assert kw["scheduler_config"].kwargs == {"capacity_scheduler_policy": "MAX_UTILIZATION"}
    assert type(kw["speculative_config"]).__name__ == "MTPDecodingConfig"
    assert kw["speculative_config"].kwargs == {"num_nextn_predict_layers": 2}
    assert kw["guided_decoding_backend"] == "xgrammar"
    await backend.close()
    assert fake.shutdowns == 1


async def test_defaults_leave_engine_defaults_alone_and_eagle3_found_in_llm_args(fake: Fake) -> None:
    await TrtLlmBackend(model="m", speculative={"kind": "eagle3", "max_draft_len": 3,
                                                "speculative_model": "draft"}).start()
    kw = fake.llm_kwargs
    assert kw is not None and kw["max_batch_size"] == 64
    assert "max_num_tokens" not in kw and "scheduler_config" not in kw
    assert type(kw["speculative_config"]).__name__ == "Eagle3DecodingConfig"
    with pytest.raises(ValueError):
        TrtLlmBackend(model="m", speculative={"kind": "medusa-ish"})
    with pytest.raises(ValueError):
        TrtLlmBackend(model="m", scheduler_policy="fastest")


async def test_streams_deltas_in_order_and_final_with_counts(fake: Fake) -> None:
    backend = TrtLlmBackend(model="m")
    await backend.start()
    deltas, final = await _collect(backend, _request(temperature=0.3, stop=("\n\n",)))
    assert deltas == ["Hel", "lo", " world"]  # the empty diff is not yielded
    assert final.text == "".join(deltas) == "Hello world"
    assert final.finish_reason == "stop"
    assert (final.prompt_tokens, final.completion_tokens, final.cached_prompt_tokens) == (11, 5, 8)
    assert final.ttft_ms > 0 and final.model == "m"
    assert fake.calls[-1]["streaming"] is True
    assert fake.params["max_tokens"] == 200  # the request's, never the API's default of 32
    assert fake.params["temperature"] == 0.3 and fake.params["stop"] == ["\n\n"]
    assert fake.params["add_special_tokens"] is False
    assert "guided_decoding" not in fake.params
    assert fake.results[-1].aborted == 0  # finished requests are not aborted


async def test_length_finish_reason_and_guided_json(fake: Fake) -> None:
    fake.script = [('{"action":', 3, None), (' "final', 2, "length")]
    schema = {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]}
    backend = TrtLlmBackend(model="m")
    await backend.start()
    _, final = await _collect(backend, _request(response_schema=schema, max_tokens=5))
    assert final.finish_reason == "length" and final.completion_tokens == 5
    guided = fake.params["guided_decoding"]
    assert type(guided).__name__ == "GuidedDecodingParams"
    assert json.loads(guided.kwargs["json"]) == schema
    assert fake.params["max_tokens"] == 5


async def test_chat_template_applied_with_tool_turns_as_user(fake: Fake) -> None:
    backend = TrtLlmBackend(model="m")
    await backend.start()
    messages = (ChatMessage(role="system", content="S"), ChatMessage(role="user", content="Q"),
                ChatMessage(role="assistant", content='{"action": "tool"}'),
                ChatMessage(role="tool", content="4", name="calculator"),
                ChatMessage(role="tool", content="ok", name="clock"))
    await _collect(backend, _request(messages=messages))
    sent, kwargs = fake.tokenizer.calls[-1]
    assert kwargs == {"tokenize": False, "add_generation_prompt": True}
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[-1]["content"] == "[calculator result] 4\n\n[clock result] ok"
    assert fake.calls[-1]["prompt"].endswith("<|user|>[calculator result] 4\n\n[clock result] ok<|assistant|>")
    assert chat_messages((ChatMessage(role="user", content="a"),)) == [{"role": "user", "content": "a"}]


async def test_aclose_after_first_delta_aborts(fake: Fake) -> None:
    fake.script = [("Hel", 1, None), HANG]
    backend = TrtLlmBackend(model="m")
    await backend.start()
    stream = backend.generate(_request())
    assert await anext(stream) == Delta("Hel")
    await stream.aclose()
    assert fake.results[-1].aborted == 1


async def test_task_cancel_after_first_delta_aborts(fake: Fake) -> None:
    fake.script = [("Hel", 1, None), HANG]
    backend = TrtLlmBackend(model="m")
    await backend.start()
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in backend.generate(_request()):
            first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    await asyncio.sleep(0)  # the consumer is now waiting on the engine's next step
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert fake.results[-1].aborted == 1


async def test_engine_errors_become_backend_errors(fake: Fake) -> None:
    backend = TrtLlmBackend(model="m")
    with pytest.raises(BackendError) as not_started:
        await anext(backend.generate(_request()))
    assert not_started.value.retriable
    await backend.start()
    fake.script = [("a", 1, None), RuntimeError("Request 3 failed: invalid grammar")]
    with pytest.raises(BackendError) as mid_stream:
        await _collect(backend, _request())
    assert not mid_stream.value.retriable and "invalid grammar" in str(mid_stream.value)
    assert fake.results[-1].aborted == 1
    fake.script = [RuntimeError("LLM is shutting down")]
    with pytest.raises(BackendError) as down:
        await _collect(backend, _request())
    assert down.value.retriable


async def test_missing_tensorrt_llm_gives_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import raises ImportError
    with pytest.raises(BackendError, match=r"pip install agentstream\[gpu\] on an NVIDIA machine, see docs/gpu.md"):
        await TrtLlmBackend(model="m").start()
