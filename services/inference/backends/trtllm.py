"""TensorRT-LLM backend, in-process through the LLM API (``tensorrt_llm.LLM``) on an NVIDIA GPU.

Why in-process: the LLM API runs the engine's in-flight batching scheduler, paged KV cache with block
reuse, and xgrammar-guided decoding behind one Python object, with no server to supervise. The facts
this file relies on (checked against the TensorRT-LLM 1.x sources: ``llmapi/llm.py``,
``executor/result.py``, ``llmapi/llm_args.py``, ``sampling_params.py``, ``serve/openai_protocol.py``):

* ``LLM.generate_async(prompt, sampling_params, streaming=True)`` submits at once and returns a
  ``RequestOutput``; iterating it with ``async for`` yields that same object after each engine step.
  ``outputs[0].text_diff`` is the text added by the step, ``outputs[0].token_ids`` all generated tokens,
  ``prompt_token_ids`` the prompt, ``finished`` the end, ``outputs[0].finish_reason`` one of
  ``stop``/``length``/``timeout``/``cancelled``, and ``cached_tokens`` the prompt tokens served from
  reused KV blocks (what ``trtllm-serve`` reports as ``prompt_tokens_details.cached_tokens``).
  ``abort()`` cancels the request in the executor, which frees its batch slot and KV blocks.
* The result binds its queue to the running event loop when created, so ``generate_async`` is called on
  the loop's thread (it tokenizes the prompt there: microseconds to a few milliseconds).
* ``SamplingParams.max_tokens`` defaults to 32, so it is always passed. ``add_special_tokens`` is off
  because the chat template already writes BOS (``trtllm-serve`` does the same for chat requests).
* Per-request failures surface as ``tensorrt_llm.llmapi.RequestError`` (or ``ValueError`` from
  argument checks); an engine failure shuts the LLM down, after which calls raise ``RuntimeError("LLM is
  shutting down")``. The API has no typed "queue full" error: requests beyond ``max_batch_size`` wait in
  the engine's queue, so only shutdown/unavailable errors are treated as retriable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

from agentstream.services.inference.backends.base import (
    BackendError,
    ChatMessage,
    Delta,
    Final,
    GenerationRequest,
)

_INSTALL_HINT = "pip install agentstream[gpu] on an NVIDIA machine, see docs/gpu.md"
#: Engine finish reasons -> ours. ``timeout`` only happens with a per-request timeout (never set here).
_FINISH = {"stop": "stop", "length": "length", "cancelled": "cancelled", "timeout": "cancelled"}
#: ``CapacitySchedulerPolicy`` members accepted for ``scheduler_policy``.
_POLICIES = ("max_utilization", "guaranteed_no_evict", "static_batch")
#: ``speculative["kind"]`` -> config classes to try, in order, in ``tensorrt_llm.llmapi`` (then
#: ``tensorrt_llm.llmapi.llm_args``, where newer classes such as ``Eagle3DecodingConfig`` live first).
_SPECULATIVE = {
    "eagle3": ("Eagle3DecodingConfig", "EagleDecodingConfig"),
    "eagle": ("EagleDecodingConfig",),
    "mtp": ("MTPDecodingConfig",),
    "ngram": ("NGramDecodingConfig",),
    "draft_target": ("DraftTargetDecodingConfig",),
    "lookahead": ("LookaheadDecodingConfig",),
}
_RETRIABLE = re.compile(r"shutting down|shut down|not started|queue is full|capacity|busy", re.I)


def chat_messages(messages: tuple[ChatMessage, ...]) -> list[dict[str, str]]:
    """Messages for ``apply_chat_template``. A tool result becomes a user turn naming the tool: HF
    templates that know a ``tool`` role expect it to answer an assistant ``tool_calls`` entry (our
    assistant turns are plain JSON actions), and many templates (Llama 2, Mistral, Gemma, Zephyr) accept
    only alternating user/assistant turns and raise otherwise. Adjacent turns of one role are merged for
    the same reason."""
    out: list[dict[str, str]] = []
    for m in messages:
        role, content = m.role, m.content
        if role == "tool":
            role, content = "user", f"[{m.name or 'tool'} result] {content}"
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + content
        else:
            out.append({"role": role, "content": content})
    return out


def _engine_error(exc: BaseException) -> BackendError:
    """A ``BackendError`` for an engine exception; retriable only when the engine is unavailable."""
    return BackendError(f"TensorRT-LLM {type(exc).__name__}: {exc}", retriable=bool(_RETRIABLE.search(str(exc))))


class TrtLlmBackend:
    """Runs a Hugging Face model (or prebuilt engine) with TensorRT-LLM's in-flight batching."""

    name = "trtllm"

    def __init__(
        self,
        *,
        model: str,
        slots: int = 64,
        max_num_tokens: int | None = None,
        free_gpu_memory_fraction: float = 0.85,
        enable_block_reuse: bool = True,
        scheduler_policy: str | None = None,
        speculative: dict[str, Any] | None = None,
        guided_decoding_backend: str | None = "xgrammar",
        tensor_parallel_size: int = 1,
        sampling_options: dict[str, Any] | None = None,
    ) -> None:
        """``slots`` is ``max_batch_size``: the sequences in flight at once (the service consumes with this
        concurrency). ``max_num_tokens`` caps the tokens of one engine step (prefill chunks included);
        None keeps TensorRT-LLM's default. ``free_gpu_memory_fraction`` is the share of the GPU memory left
        after loading the weights that goes to the KV cache. ``enable_block_reuse`` keeps finished
        requests' KV blocks so a run's next step (same system prompt and history, a few tokens longer)
        skips prefill of the shared prefix. ``scheduler_policy``: ``guaranteed_no_evict`` (admit a request
        only if its whole KV budget fits) or ``max_utilization`` (pack more, pausing requests when memory
        runs out). ``speculative``: ``{"kind": "eagle3"|"eagle"|"mtp"|"ngram"|"draft_target"|"lookahead",
        ...}``, the other keys going to that TensorRT-LLM config class (e.g. ``max_draft_len``,
        ``speculative_model``). ``guided_decoding_backend`` (``xgrammar`` or ``llguidance``; None turns
        structured output off: schemas are then ignored). ``sampling_options``: extra ``SamplingParams``
        fields for every request (e.g. ``{"ignore_eos": True}`` for fixed-length benchmarks)."""
        if slots < 1:
            raise ValueError("slots must be >= 1")
        if scheduler_policy is not None and scheduler_policy.lower() not in _POLICIES:
            raise ValueError(f"scheduler_policy must be one of {', '.join(_POLICIES)}")
        if speculative is not None and speculative.get("kind") not in _SPECULATIVE:
            raise ValueError(f"speculative['kind'] must be one of {', '.join(_SPECULATIVE)}")
        self.model = model
        self.slots = slots
        self.max_num_tokens = max_num_tokens
        self.free_gpu_memory_fraction = free_gpu_memory_fraction
        self.enable_block_reuse = enable_block_reuse
        self.scheduler_policy = scheduler_policy
        self.speculative = dict(speculative) if speculative else None
        self.guided_decoding_backend = guided_decoding_backend or None
        self.tensor_parallel_size = tensor_parallel_size
        self.sampling_options = dict(sampling_options or {})
        self._llm: Any = None
        self._api: dict[str, Any] = {}
        self._load_lock = threading.Lock()
        self._active: set[Any] = set()
        self._idle = asyncio.Event()  # set while no generation is running
        self._idle.set()

    async def start(self) -> None:
        """Import TensorRT-LLM and load the model in a thread (minutes: download, weight loading, CUDA
        graph capture and KV allocation), so the event loop keeps running. Idempotent."""
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        with self._load_lock:
            if self._llm is not None:
                return
            try:
                import tensorrt_llm
                from tensorrt_llm import llmapi
            except Exception as exc:  # not installed, or its CUDA libraries do not load
                raise BackendError(f"tensorrt_llm could not be imported ({exc}): {_INSTALL_HINT}") from exc
            kwargs: dict[str, Any] = {
                "model": self.model,
                "max_batch_size": self.slots,
                "tensor_parallel_size": self.tensor_parallel_size,
                "kv_cache_config": llmapi.KvCacheConfig(
                    enable_block_reuse=self.enable_block_reuse,
                    free_gpu_memory_fraction=self.free_gpu_memory_fraction),
            }
            if self.max_num_tokens:
                kwargs["max_num_tokens"] = self.max_num_tokens
            if self.guided_decoding_backend:
                kwargs["guided_decoding_backend"] = self.guided_decoding_backend
            if self.scheduler_policy:
                policy = getattr(llmapi.CapacitySchedulerPolicy, self.scheduler_policy.upper())
                kwargs["scheduler_config"] = llmapi.SchedulerConfig(capacity_scheduler_policy=policy)
            if self.speculative:
                kwargs["speculative_config"] = self._speculative_config(llmapi)
            try:
                llm = tensorrt_llm.LLM(**kwargs)
            except Exception as exc:
                raise BackendError(f"TensorRT-LLM failed to load {self.model}: {exc}") from exc
            self._api = {"SamplingParams": tensorrt_llm.SamplingParams,
                         "GuidedDecodingParams": llmapi.GuidedDecodingParams}
            self._llm = llm

    def _speculative_config(self, llmapi: Any) -> Any:
        """The decoding config object for ``self.speculative`` (see ``__init__``)."""
        options = dict(self.speculative or {})
        kind = options.pop("kind")
        modules = [llmapi]
        try:
            from tensorrt_llm.llmapi import llm_args
            modules.append(llm_args)
        except ImportError:
            pass
        for class_name in _SPECULATIVE[kind]:
            for module in modules:
                if (cls := getattr(module, class_name, None)) is not None:
                    return cls(**options)
        raise BackendError(f"this TensorRT-LLM has no {' or '.join(_SPECULATIVE[kind])} for {kind!r}")

    async def close(self) -> None:
        """Abort running generations (their streams end with ``cancelled``) and shut the engine down."""
        llm, self._llm = self._llm, None
        for result in list(self._active):
            _abort(result)
        if self._active:  # let the aborted streams receive their final response before the engine goes
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 5)
        if llm is not None and hasattr(llm, "shutdown"):
            await asyncio.to_thread(llm.shutdown)

    def _prompt(self, llm: Any, request: GenerationRequest) -> str:
        try:
            return llm.tokenizer.apply_chat_template(
                chat_messages(request.messages), tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # no template, or one that rejects the conversation
            raise BackendError(f"{self.model}: the chat template failed: {exc}") from exc

    def _sampling_params(self, request: GenerationRequest) -> Any:
        options: dict[str, Any] = {
            "max_tokens": request.max_tokens,  # the API's default is 32
            "temperature": request.temperature,
            "add_special_tokens": False,  # the chat template writes BOS itself
            **self.sampling_options,
        }
        if request.stop:
            options["stop"] = list(request.stop)
        if request.response_schema is not None and self.guided_decoding_backend:
            options["guided_decoding"] = self._api["GuidedDecodingParams"](
                json=json.dumps(request.response_schema))
        return self._api["SamplingParams"](**options)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta | Final, None]:
        """Stream one chat completion; closing this iterator (or cancelling its task) aborts the request
        in the engine, freeing its batch slot."""
        llm = self._llm
        if llm is None:
            raise BackendError("TensorRT-LLM backend is not started", retriable=True)
        prompt = self._prompt(llm, request)
        params = self._sampling_params(request)
        started = time.perf_counter()
        try:
            result = llm.generate_async(prompt, sampling_params=params, streaming=True)
        except Exception as exc:
            raise _engine_error(exc) from exc
        self._active.add(result)
        self._idle.clear()
        parts: list[str] = []
        ttft_ms = 0.0
        try:
            try:
                async for out in result:
                    diff = out.outputs[0].text_diff
                    if diff:
                        if not parts:
                            ttft_ms = (time.perf_counter() - started) * 1000
                        parts.append(diff)
                        yield Delta(diff)
            except Exception as exc:
                raise _engine_error(exc) from exc
        finally:
            self._active.discard(result)
            if not self._active:
                self._idle.set()
            if not result.finished:  # cancelled, aclose()d or failed: free the slot now
                _abort(result)
        output = result.outputs[0]
        extra: dict[str, Any] = {}
        if (stop_reason := getattr(output, "stop_reason", None)) is not None:
            extra["stop_reason"] = stop_reason  # the stop string or token that ended it
        if (per_iter := getattr(result, "avg_decoded_tokens_per_iter", None)) is not None:
            extra["avg_decoded_tokens_per_iter"] = per_iter  # > 1 when speculative decoding accepts drafts
        yield Final(
            text=output.text if output.text is not None else "".join(parts),
            finish_reason=_FINISH.get(output.finish_reason or "", "cancelled"),
            prompt_tokens=len(result.prompt_token_ids or ()),
            completion_tokens=len(output.token_ids or ()),
            cached_prompt_tokens=int(getattr(result, "cached_tokens", 0) or 0),
            ttft_ms=ttft_ms,
            model=self.model,
            extra=extra,
        )


def _abort(result: Any) -> None:
    """Cancel a request in the engine; best effort (the executor may already be gone)."""
    try:
        result.abort()
    except Exception:
        pass
