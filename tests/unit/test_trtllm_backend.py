"""The TensorRT-LLM backend against a strict stand-in ``tensorrt_llm`` of each release (no GPU, no network).

The stand-in (``trtllm_standin.py``) refuses what the real library refuses: unknown fields, the 1.0
spelling of the draft model on later releases and the later one on 1.0, a long prompt without chunked
prefill, calls after the engine shut down. Tests that do not depend on the release run against each.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.trtllm import TrtLlmBackend, chat_messages, held_back
from agentstream.services.inference.backends.trtllm_errors import engine_error
from agentstream.services.inference.backends.trtllm_options import version_tuple
from agentstream.streams.core.errors import BackendError
from tests.unit.trtllm_standin import HANG, MODEL_CONTEXT, TOKENS_PER_BLOCK, VERSIONS, Fake, RequestError


@pytest.fixture(params=VERSIONS)
def fake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Fake:
    fake = Fake(request.param)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", fake.package)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", fake.llmapi)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi.llm_args", fake.llm_args)
    return fake


def _request(**kw: Any) -> GenerationRequest:
    defaults: dict[str, Any] = dict(request_id="s1", max_tokens=200, messages=(
        ChatMessage(role="system", content="You plan."), ChatMessage(role="user", content="What is 2+2?")))
    return GenerationRequest(**(defaults | kw))


def _long_request(chars: int, **kw: Any) -> GenerationRequest:
    return _request(messages=(ChatMessage(role="user", content="x" * chars),), **kw)


async def _collect(backend: TrtLlmBackend, request: GenerationRequest) -> tuple[list[str], Final]:
    items = [item async for item in backend.generate(request)]
    assert isinstance(items[-1], Final) and all(isinstance(i, Delta) for i in items[:-1])
    return [i.text for i in items[:-1]], items[-1]


async def _started(**kw: Any) -> TrtLlmBackend:
    backend = TrtLlmBackend(model=kw.pop("model", "m"), **kw)
    await backend.start()
    return backend


# -- building the engine -------------------------------------------------------------------------

async def test_llm_built_with_chunked_prefill_limits_batching_kv_reuse_and_memory_fraction(fake: Fake) -> None:
    backend = TrtLlmBackend(model="Qwen/Qwen2.5-0.5B-Instruct", slots=32, max_num_tokens=4096, max_seq_len=16384,
                            free_gpu_memory_fraction=0.7, scheduler_policy="max_utilization",
                            speculative={"kind": "mtp", "num_nextn_predict_layers": 2})
    await backend.start()
    await backend.start()  # idempotent: one engine
    kw = fake.llm_kwargs
    assert kw is not None
    assert kw["model"] == "Qwen/Qwen2.5-0.5B-Instruct" and kw["max_batch_size"] == 32
    assert kw["max_num_tokens"] == 4096 and kw["max_seq_len"] == 16384 and kw["tensor_parallel_size"] == 1
    assert kw["enable_chunked_prefill"] is True
    assert kw["kv_cache_config"].kwargs == {"enable_block_reuse": True, "free_gpu_memory_fraction": 0.7}
    assert kw["scheduler_config"].kwargs["capacity_scheduler_policy"].name == "MAX_UTILIZATION"
    assert type(kw["speculative_config"]).__name__ == "MTPDecodingConfig"
    assert kw["speculative_config"].kwargs == {"num_nextn_predict_layers": 2}
    assert kw["guided_decoding_backend"] == "xgrammar"
    # Iteration statistics only where the result has no cached_tokens (1.0): they cost every step.
    assert kw.get("enable_iter_perf_stats", False) is (fake.version == "1.0")
    await backend.close()
    assert fake.shutdowns == 1


async def test_defaults_leave_engine_limits_to_the_engine(fake: Fake) -> None:
    await _started()
    kw = fake.llm_kwargs
    assert kw is not None and kw["max_batch_size"] == 64 and kw["enable_chunked_prefill"] is True
    assert "max_num_tokens" not in kw and "max_seq_len" not in kw and "scheduler_config" not in kw


@pytest.mark.parametrize("given", ["speculative_model", "speculative_model_dir"])
async def test_draft_model_goes_under_the_field_the_installed_release_declares(fake: Fake, given: str) -> None:
    await _started(speculative={"kind": "eagle3", "max_draft_len": 3, given: "/models/draft",
                                "eagle3_one_model": True})
    kw = fake.llm_kwargs
    assert kw is not None
    config = kw["speculative_config"]
    assert type(config).__name__ == "EagleDecodingConfig"  # eagle3 falls back to it where no Eagle3 class exists
    expected = "speculative_model_dir" if fake.version == "1.0" else "speculative_model"
    assert config.kwargs == {"max_draft_len": 3, expected: "/models/draft", "eagle3_one_model": True}


async def test_a_field_the_release_lacks_is_refused_before_the_model_loads(fake: Fake) -> None:
    field = "max_total_draft_tokens"  # in DecodingBaseConfig from 1.1 only
    backend = TrtLlmBackend(model="m", speculative={"kind": "ngram", "max_draft_len": 4, field: 4})
    if fake.version == "1.0":
        with pytest.raises(BackendError, match=f"NGramDecodingConfig of this TensorRT-LLM has no field {field}"):
            await backend.start()
        assert fake.llm_kwargs is None  # refused before LLM(...): no minutes of loading first
    else:
        await backend.start()
        assert fake.llm_kwargs is not None and fake.llm_kwargs["speculative_config"].kwargs[field] == 4


def test_lookahead_static_batch_and_unknown_options_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"TensorRT-engine backend.*PyTorch"):
        TrtLlmBackend(model="m", speculative={"kind": "lookahead", "max_window_size": 4})
    with pytest.raises(ValueError, match="static batching is not offered by the PyTorch backend"):
        TrtLlmBackend(model="m", scheduler_policy="static_batch")
    with pytest.raises(ValueError, match="must be one of"):
        TrtLlmBackend(model="m", speculative={"kind": "medusa-ish"})
    with pytest.raises(ValueError, match="must be one of"):
        TrtLlmBackend(model="m", scheduler_policy="fastest")
    with pytest.raises(ValueError, match="once"):
        TrtLlmBackend(model="m", speculative={"kind": "eagle", "speculative_model": "a", "speculative_model_dir": "a"})
    with pytest.raises(ValueError, match="max_seq_len"):
        TrtLlmBackend(model="m", max_seq_len=0)


async def test_an_unknown_sampling_option_fails_the_request_clearly(fake: Fake) -> None:
    backend = await _started(sampling_options={"ignore_eos": True, "max_new_tokens": 5})  # not the API's name
    with pytest.raises(BackendError, match=r"SamplingParams.*max_new_tokens") as refused:
        await anext(backend.generate(_request()))
    assert not refused.value.retriable and not refused.value.fatal


# -- streaming -----------------------------------------------------------------------------------

async def test_streams_deltas_in_order_and_final_with_counts(fake: Fake) -> None:
    backend = await _started()
    deltas, final = await _collect(backend, _request(temperature=0.3, stop=("\n\n",)))
    assert deltas == ["Hel", "lo", " world"]  # the empty diff is not yielded
    assert final.text == "".join(deltas) == "Hello world"
    assert final.finish_reason == "stop"
    assert final.prompt_tokens == len(fake.results[-1].prompt_token_ids) > 0
    assert final.completion_tokens == 5
    assert final.ttft_ms > 0 and final.model == "m"
    assert fake.calls[-1]["streaming"] is True
    assert fake.params.max_tokens == 200  # the request's, never the API's default of 32
    assert fake.params.temperature == 0.3 and fake.params.stop == ["\n\n"]
    assert fake.params.add_special_tokens is False and fake.params.guided_decoding is None
    assert fake.results[-1].aborts == 0  # finished requests are not aborted


async def test_the_engine_gets_the_chat_templates_token_ids_without_a_second_bos(fake: Fake) -> None:
    backend = await _started()
    await _collect(backend, _request())
    sent = fake.calls[-1]["inputs"]
    text = fake.tokenizer.template_calls[-1][0]
    assert isinstance(sent, list) and sent == [ord(c) for c in "<|system|>You plan.<|user|>What is 2+2?<|assistant|>"]
    assert text[0] == {"role": "system", "content": "You plan."}


async def test_cached_tokens_reported_from_1_1_and_unknown_not_zero_on_1_0(fake: Fake) -> None:
    backend = await _started()
    history = "A long shared system prompt. " * 8
    first = _request(messages=(ChatMessage(role="system", content=history), ChatMessage(role="user", content="Q1")))
    second = _request(messages=(ChatMessage(role="system", content=history), ChatMessage(role="user", content="Q2")))
    _, one = await _collect(backend, first)
    _, two = await _collect(backend, second)
    reuse = await backend.kv_reuse()
    if fake.version == "1.0":
        assert one.cached_prompt_tokens is None and two.cached_prompt_tokens is None
        assert reuse is not None and reuse["tokens_per_block"] == TOKENS_PER_BLOCK
        assert reuse["reused_tokens_estimate"] == reuse["reused_blocks"] * TOKENS_PER_BLOCK > 0
    else:
        assert one.cached_prompt_tokens == 0  # measured: nothing to reuse on the first request
        assert two.cached_prompt_tokens is not None and two.cached_prompt_tokens >= TOKENS_PER_BLOCK
        assert reuse is None  # per-request figures: no iteration statistics asked for


async def test_length_finish_reason_and_guided_json(fake: Fake) -> None:
    fake.engine.script = [('{"action":', 3, None), (' "final', 2, "length")]
    schema = {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]}
    backend = await _started()
    _, final = await _collect(backend, _request(response_schema=schema, max_tokens=5, top_p=0.9, seed=11))
    assert final.finish_reason == "length" and final.completion_tokens == 5
    guided = fake.params.guided_decoding
    assert type(guided).__name__ == "GuidedDecodingParams"
    assert json.loads(guided.kwargs["json"]) == schema
    assert fake.params.max_tokens == 5
    assert (fake.params.top_p, fake.params.seed) == (0.9, 11)  # the task's sampling settings


async def test_chat_template_applied_with_tool_turns_as_user(fake: Fake) -> None:
    backend = await _started()
    messages = (ChatMessage(role="system", content="S"), ChatMessage(role="user", content="Q"),
                ChatMessage(role="assistant", content='{"action": "tool"}'),
                ChatMessage(role="tool", content="4", name="calculator"),
                ChatMessage(role="tool", content="ok", name="clock"))
    await _collect(backend, _request(messages=messages))
    sent, kwargs = fake.tokenizer.template_calls[-1]
    assert kwargs == {"tokenize": False, "add_generation_prompt": True}
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[-1]["content"] == "[calculator result] 4\n\n[clock result] ok"
    assert chat_messages((ChatMessage(role="user", content="a"),)) == [{"role": "user", "content": "a"}]


# -- stop strings ----------------------------------------------------------------------------------

async def test_a_stop_string_split_over_steps_never_reaches_the_deltas(fake: Fake) -> None:
    # The engine streams "lo\n" before it knows "\n\n" is coming; the final text drops the stop string.
    fake.engine.script = [("Hel", 1, None), ("lo\n", 1, None), ("\nmore", 2, None), (" never", 1, "stop")]
    backend = await _started()
    deltas, final = await _collect(backend, _request(stop=("\n\n",)))
    assert final.text == "Hello" and final.finish_reason == "stop"
    assert "".join(deltas) == final.text and all("\n" not in d for d in deltas)
    assert fake.results[-1].outputs[0].stop_reason == "\n\n"


async def test_held_back_text_that_is_no_stop_string_after_all_is_released(fake: Fake) -> None:
    fake.engine.script = [("a\n", 1, None), ("b", 1, None), ("c\n", 1, "length")]
    backend = await _started()
    deltas, final = await _collect(backend, _request(stop=("\n\n",)))
    assert deltas == ["a", "\nb", "c", "\n"]  # "\n" waits a step each time, then goes out
    assert "".join(deltas) == final.text == "a\nbc\n" and final.finish_reason == "length"


def test_held_back_is_the_longest_stop_prefix_at_the_end() -> None:
    assert held_back("abc", ("</s>",)) == 0
    assert held_back("abc<", ("</s>",)) == 1
    assert held_back("abc</", ("</s>", "<|end|>")) == 2
    assert held_back("ab</s>x", ("</s>",)) == 5  # a whole stop string: from its start on
    assert held_back("abc", ()) == 0


# -- long conversations ----------------------------------------------------------------------------

async def test_a_prompt_longer_than_one_step_runs_with_chunked_prefill(fake: Fake) -> None:
    backend = await _started(max_num_tokens=256, max_seq_len=MODEL_CONTEXT)
    _, final = await _collect(backend, _long_request(1000, max_tokens=50))
    assert final.finish_reason == "stop" and final.prompt_tokens > 256


async def test_without_chunked_prefill_a_long_prompt_is_refused_up_front(fake: Fake) -> None:
    backend = await _started(max_num_tokens=256, enable_chunked_prefill=False)
    with pytest.raises(BackendError, match=r"prompt tokens > max_num_tokens 256 with chunked prefill off") as refused:
        await anext(backend.generate(_long_request(1000)))
    assert not refused.value.retriable and not refused.value.fatal
    assert fake.calls == []  # the engine never saw it


async def test_a_conversation_that_cannot_fit_is_refused_before_the_engine(fake: Fake) -> None:
    backend = await _started(max_seq_len=1024)
    with pytest.raises(BackendError, match=r"does not fit: \d+ prompt tokens \+ 200 max_tokens > max_seq_len 1024"):
        await anext(backend.generate(_long_request(900, max_tokens=200)))
    assert fake.calls == []
    _, final = await _collect(backend, _long_request(700, max_tokens=200))  # fits
    assert final.text == "Hello world"


async def test_the_engines_own_limit_applies_when_none_is_configured(fake: Fake) -> None:
    backend = await _started()
    with pytest.raises(BackendError, match="default_max_tokens") as refused:  # the engine's error, not retriable
        await _collect(backend, _long_request(MODEL_CONTEXT + 10))
    assert not refused.value.retriable and not refused.value.fatal


# -- cancelling ------------------------------------------------------------------------------------

async def test_aclose_after_first_delta_aborts(fake: Fake) -> None:
    fake.engine.script = [("Hel", 1, None), HANG]
    backend = await _started()
    stream = backend.generate(_request())
    assert await anext(stream) == Delta("Hel")
    await stream.aclose()
    assert fake.results[-1].aborts == 1


async def test_task_cancel_after_first_delta_aborts(fake: Fake) -> None:
    fake.engine.script = [("Hel", 1, None), HANG]
    backend = await _started()
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
    assert fake.results[-1].aborts == 1


async def test_close_ends_running_streams_with_the_engines_cancelled_response(fake: Fake) -> None:
    fake.engine.script = [("Hel", 1, None), HANG]
    backend = await _started()
    stream = backend.generate(_request())
    assert await anext(stream) == Delta("Hel")
    rest = asyncio.create_task(anext(stream))
    await asyncio.sleep(0)
    await backend.close()
    final = await asyncio.wait_for(rest, 5)
    assert isinstance(final, Final) and final.finish_reason == "cancelled" and final.text == "Hel"
    assert fake.shutdowns == 1


# -- failures --------------------------------------------------------------------------------------

async def test_not_started_is_retriable_and_request_errors_fail_only_their_request(fake: Fake) -> None:
    backend = TrtLlmBackend(model="m")
    with pytest.raises(BackendError) as not_started:
        await anext(backend.generate(_request()))
    assert not_started.value.retriable
    await backend.start()
    # Words that once made an error retriable ("capacity", "busy") occur in errors that fail every time.
    for message in ("invalid grammar: exceeds capacity", "tokenizer busy with an invalid token"):
        fake.engine.script = [("a", 1, None), RequestError(message)]
        with pytest.raises(BackendError) as failed:
            await _collect(backend, _request())
        assert not failed.value.retriable and not failed.value.fatal and message in str(failed.value)
        assert fake.results[-1].aborts == 1
    fake.engine.script = [("fine", 1, "stop")]
    deltas, _ = await _collect(backend, _request())  # the engine is fine: the next request runs
    assert deltas


async def test_a_dead_engine_is_fatal_once_and_for_every_later_request(fake: Fake) -> None:
    fake.engine.script = [("Hel", 1, None), HANG]
    backend = await _started()
    stream = backend.generate(_request())
    await anext(stream)
    fake.engine.die()
    with pytest.raises(BackendError, match="CUDA error") as died:
        await anext(stream)
    assert died.value.fatal and not died.value.retriable and died.value.dependency is None
    calls = len(fake.calls)
    with pytest.raises(BackendError) as later:
        await anext(backend.generate(_request()))
    assert later.value.fatal and len(fake.calls) == calls  # refused without touching the engine
    await backend.close()  # a dead engine still closes


async def test_an_engine_that_shut_down_between_requests_is_fatal(fake: Fake) -> None:
    backend = await _started()
    fake.engine.shut_down = True  # the executor stopped after an internal error; generate_async says so
    with pytest.raises(BackendError, match="LLM is shutting down") as down:
        await anext(backend.generate(_request()))
    assert down.value.fatal and fake.calls == []


def test_shutting_down_during_our_own_close_is_left_for_redelivery() -> None:
    error = engine_error(RuntimeError("LLM is shutting down"), closing=True)
    assert error.retriable and not error.fatal
    assert not engine_error(ValueError("bad request")).retriable


def test_version_tuple() -> None:
    assert version_tuple("1.0.0rc4") == (1, 0) and version_tuple("1.2.1") == (1, 2) and version_tuple("") == (0, 0)


async def test_missing_tensorrt_llm_gives_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import raises ImportError
    with pytest.raises(BackendError, match=r"pip install agentstream\[gpu\] on an NVIDIA machine, see docs/gpu.md"):
        await TrtLlmBackend(model="m").start()
