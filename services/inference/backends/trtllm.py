"""TensorRT-LLM backend, in-process through the LLM API (``tensorrt_llm.LLM``) on an NVIDIA GPU.

Why in-process: the LLM API runs the engine's in-flight batching scheduler, paged KV cache with block
reuse, and xgrammar-guided decoding behind one Python object, with no server to supervise. The facts
this file relies on (checked against the TensorRT-LLM 1.x sources: ``llmapi/llm.py``,
``executor/result.py``, ``llmapi/llm_args.py``, ``sampling_params.py``, ``serve/openai_protocol.py``):

* ``LLM.generate_async(prompt_token_ids, sampling_params, streaming=True)`` submits at once and returns a
  ``RequestOutput``; iterating it with ``async for`` yields that same object after each engine step.
  ``outputs[0].text_diff`` is the text added by the step, ``outputs[0].token_ids`` all generated tokens,
  ``prompt_token_ids`` the prompt, ``finished`` the end, ``outputs[0].finish_reason`` one of
  ``stop``/``length``/``timeout``/``cancelled``, and ``cached_tokens`` the prompt tokens served from
  reused KV blocks (what ``trtllm-serve`` reports as ``prompt_tokens_details.cached_tokens``).
  ``abort()`` cancels the request in the executor, which frees its batch slot and KV blocks.
* The result binds its queue to the running event loop when created, so ``generate_async`` is called on
  the loop's thread. The prompt is tokenized here, once (microseconds to a few milliseconds), to check
  that the conversation fits before the engine sees it; the engine gets the token ids.
* ``SamplingParams.max_tokens`` defaults to 32, so it is always passed. ``add_special_tokens`` is off
  because the chat template already writes BOS (``trtllm-serve`` does the same for chat requests).
* Per-request failures surface as ``tensorrt_llm.llmapi.RequestError`` (or ``ValueError`` from
  argument checks); an engine failure shuts the LLM down, after which ``generate_async`` raises
  ``RuntimeError("LLM is shutting down")``: the backend then counts as dead (``trtllm_errors.py``).
* Stop strings: the engine matches them on token ids and, at the end, shortens the final ``text`` (and
  ``token_ids``) to drop the stop string, while the deltas already streamed may hold its first tokens.
  The backend holds back streamed text that could still be the start of a stop string and releases it
  once it cannot be, so the deltas it yields add up to the final text and never show a stop string.
* Long prompts: chunked prefill is on by default (``enable_chunked_prefill`` is off in TensorRT-LLM),
  so a prompt longer than ``max_num_tokens`` is prefilled over several engine steps instead of being
  refused; a conversation longer than ``max_seq_len`` is refused here, before the engine sees it.
* Reuse telemetry: ``RequestOutput.cached_tokens`` exists from 1.1. On 1.0 the per-request figure is
  unknown (``Final.cached_prompt_tokens`` is None, never 0) and the engine's cumulative KV-cache reuse
  comes from its iteration statistics (``enable_iter_perf_stats``, ``LLM.get_stats``): ``kv_reuse()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

from agentstream.services.inference.backends import tool_call_text
from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.trtllm_errors import engine_error
from agentstream.services.inference.backends.trtllm_options import (
    ContextLimits,
    check_llm_fields,
    check_policy,
    check_speculative_kind,
    speculative_config,
    version_tuple,
)
from agentstream.streams.core.errors import BackendError
from agentstream.streams.core.events import ToolCall

log = logging.getLogger(__name__)
_INSTALL_HINT = "pip install agentstream[gpu] on an NVIDIA machine, see docs/gpu.md"
#: Engine finish reasons -> ours. ``timeout`` only happens with a per-request timeout (never set here).
_FINISH = {"stop": "stop", "length": "length", "cancelled": "cancelled", "timeout": "cancelled"}
#: The first release whose ``RequestOutput`` has ``cached_tokens``; before it, iteration statistics.
_CACHED_TOKENS_SINCE = (1, 1)


def chat_messages(messages: tuple[ChatMessage, ...], *, native: bool = False) -> list[dict[str, Any]]:
    """Messages for ``apply_chat_template``. A tool result becomes a user turn naming the tool: HF
    templates that know a ``tool`` role expect it to answer an assistant ``tool_calls`` entry (our
    assistant turns are plain JSON actions), and many templates (Llama 2, Mistral, Gemma, Zephyr) accept
    only alternating user/assistant turns and raise otherwise. Adjacent turns of one role are merged for
    the same reason. ``native`` (tool calling through the template): calls and results keep their
    structure, as templates with tools expect (arguments as objects)."""
    if native:
        return [_native_message(m) for m in messages]
    out: list[dict[str, Any]] = []
    for m in messages:
        role, content = m.role, m.content
        if role == "tool":
            role, content = "user", f"[{m.name or 'tool'} result] {content}"
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + content
        else:
            out.append({"role": role, "content": content})
    return out


def _native_message(m: ChatMessage) -> dict[str, Any]:
    if m.role == "tool" and m.tool_call_id is not None:
        return {"role": "tool", "tool_call_id": m.tool_call_id, "name": m.name, "content": m.content}
    if m.tool_calls:
        return {"role": m.role, "content": m.content, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.loads(c.arguments or "{}")}}
            for c in m.tool_calls]}
    return {"role": m.role, "content": m.content}


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` (streamed, not yet shown) must wait: those that are, or
    may become, a stop string, which the engine removes from the final text."""
    hold = 0
    for stop in stops:
        at = text.find(stop)
        if at >= 0:
            hold = max(hold, len(text) - at)
            continue
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                hold = max(hold, k)
                break
    return hold


class TrtLlmBackend:
    """Runs a Hugging Face model (or prebuilt engine) with TensorRT-LLM's in-flight batching."""

    name = "trtllm"

    def __init__(
        self,
        *,
        model: str,
        slots: int = 64,
        max_num_tokens: int | None = None,
        max_seq_len: int | None = None,
        enable_chunked_prefill: bool = True,
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
        ``max_seq_len`` caps prompt + generated tokens of one sequence (KV budget per sequence); None
        keeps TensorRT-LLM's defaults (its ``max_num_tokens`` default, the model's context length).
        ``enable_chunked_prefill`` (on) splits a prompt longer than ``max_num_tokens`` over several steps:
        without it such a prompt is refused, and agent conversations grow step after step.
        ``free_gpu_memory_fraction`` is the share of the GPU memory left after loading the weights that
        goes to the KV cache. ``enable_block_reuse`` keeps finished requests' KV blocks so a run's next
        step (same system prompt and history, a few tokens longer) skips prefill of the shared prefix.
        ``scheduler_policy``: ``guaranteed_no_evict`` (admit a request only if its whole KV budget fits)
        or ``max_utilization`` (pack more, pausing requests when memory runs out); ``static_batch`` is
        refused (trtllm_options.py). ``speculative``: ``{"kind": "eagle3"|"eagle"|"mtp"|"ngram"|
        "draft_target", ...}``, the other keys going to that TensorRT-LLM config class (e.g.
        ``max_draft_len``, ``speculative_model``: renamed to the field the installed release has);
        ``lookahead`` is refused. ``guided_decoding_backend`` (``xgrammar`` or ``llguidance``; None turns
        structured output off: schemas are then ignored). ``sampling_options``: extra ``SamplingParams``
        fields for every request (e.g. ``{"ignore_eos": True}`` for fixed-length benchmarks)."""
        if slots < 1:
            raise ValueError("slots must be >= 1")
        for name, value in (("max_num_tokens", max_num_tokens), ("max_seq_len", max_seq_len)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1")
        check_policy(scheduler_policy)
        check_speculative_kind(speculative)
        self.model = model
        self.slots = slots
        self.max_num_tokens = max_num_tokens
        self.max_seq_len = max_seq_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.free_gpu_memory_fraction = free_gpu_memory_fraction
        self.enable_block_reuse = enable_block_reuse
        self.scheduler_policy = scheduler_policy
        self.speculative = dict(speculative) if speculative else None
        self.guided_decoding_backend = guided_decoding_backend or None
        self.tensor_parallel_size = tensor_parallel_size
        self.sampling_options = dict(sampling_options or {})
        #: The engine's limits once loaded (what ``generate`` checks a conversation against).
        self.limits = ContextLimits(max_seq_len, max_num_tokens, enable_chunked_prefill)
        #: Whether reuse comes from iteration statistics (releases without ``cached_tokens``).
        self.iteration_stats = False
        self._kv_stats: dict[str, Any] | None = None
        self._llm: Any = None
        self._api: dict[str, Any] = {}
        self._load_lock = threading.Lock()
        self._active: set[Any] = set()
        self._idle = asyncio.Event()  # set while no generation is running
        self._idle.set()
        self._closing = False
        #: Why the engine is dead (a fatal error), or None: every later request fails at once with it.
        self._dead: str | None = None

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
            try:
                from tensorrt_llm.llmapi import llm_args
            except ImportError:  # where the config classes live moved between releases: llmapi suffices
                llm_args = None
            kwargs = self._llm_kwargs(tensorrt_llm, llmapi, llm_args)
            check_llm_fields(getattr(llm_args, "TorchLlmArgs", None), kwargs)
            try:
                llm = tensorrt_llm.LLM(**kwargs)
            except Exception as exc:
                raise BackendError(f"TensorRT-LLM failed to load {self.model}: {exc}") from exc
            args = getattr(llm, "args", None)  # the validated arguments, with the engine's own defaults
            self.limits = ContextLimits(
                max_seq_len=_positive(getattr(args, "max_seq_len", None)) or self.max_seq_len,
                max_num_tokens=_positive(getattr(args, "max_num_tokens", None)) or self.max_num_tokens,
                chunked_prefill=self.enable_chunked_prefill)
            self._api = {"SamplingParams": tensorrt_llm.SamplingParams,
                         "GuidedDecodingParams": llmapi.GuidedDecodingParams}
            self._llm = llm

    def _llm_kwargs(self, tensorrt_llm: Any, llmapi: Any, llm_args: Any) -> dict[str, Any]:
        """``LLM(...)``'s arguments; raises ``BackendError`` for options this release cannot take."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_batch_size": self.slots,
            "tensor_parallel_size": self.tensor_parallel_size,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "kv_cache_config": llmapi.KvCacheConfig(
                enable_block_reuse=self.enable_block_reuse,
                free_gpu_memory_fraction=self.free_gpu_memory_fraction),
        }
        if self.max_num_tokens:
            kwargs["max_num_tokens"] = self.max_num_tokens
        if self.max_seq_len:
            kwargs["max_seq_len"] = self.max_seq_len
        if self.guided_decoding_backend:
            kwargs["guided_decoding_backend"] = self.guided_decoding_backend
        if self.scheduler_policy:
            policy = getattr(llmapi.CapacitySchedulerPolicy, self.scheduler_policy.upper())
            kwargs["scheduler_config"] = llmapi.SchedulerConfig(capacity_scheduler_policy=policy)
        if self.speculative:
            modules = [llmapi] + ([llm_args] if llm_args is not None else [])
            kwargs["speculative_config"] = speculative_config(modules, self.speculative)
        version = version_tuple(str(getattr(tensorrt_llm, "__version__", "")))
        if self.enable_block_reuse and version < _CACHED_TOKENS_SINCE:
            # No per-request cached_tokens: the engine's reuse counters are the only measurement left.
            kwargs["enable_iter_perf_stats"] = True
            self.iteration_stats = True
        return kwargs

    async def close(self) -> None:
        """Abort running generations (their streams end with ``cancelled``) and shut the engine down."""
        self._closing = True
        llm, self._llm = self._llm, None
        for result in list(self._active):
            _abort(result)
        if self._active:  # let the aborted streams receive their final response before the engine goes
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 5)
        if llm is not None and hasattr(llm, "shutdown"):
            try:
                await asyncio.to_thread(llm.shutdown)
            except Exception as exc:  # a dead engine may fail its own shutdown: nothing is left to free
                log.warning("TensorRT-LLM shutdown failed: %s", exc)

    async def kv_reuse(self) -> dict[str, Any] | None:
        """The engine's cumulative KV-cache reuse from its iteration statistics (releases without
        per-request ``cached_tokens``), or None when it has none. ``reused_tokens_estimate`` counts whole
        reused blocks (``reusedBlocks`` x ``tokensPerBlock``): an estimate, attributable to no request."""
        llm = self._llm
        if not self.iteration_stats or llm is None:
            return None
        for stat in await asyncio.to_thread(llm.get_stats, 0.1):  # drains the statistics queue
            record = json.loads(stat) if isinstance(stat, str) else stat
            kv = record.get("kvCacheStats") if isinstance(record, dict) else None
            if kv:
                self._kv_stats = kv  # cumulative counters: the newest iteration holds the totals
        kv = self._kv_stats
        if kv is None:
            return None
        reused, per_block = int(kv.get("reusedBlocks", 0)), int(kv.get("tokensPerBlock", 0))
        return {"reused_blocks": reused, "missed_blocks": int(kv.get("missedBlocks", 0)),
                "cache_hit_rate": kv.get("cacheHitRate"), "tokens_per_block": per_block,
                "reused_tokens_estimate": reused * per_block}

    def _prompt_ids(self, llm: Any, request: GenerationRequest) -> list[int]:
        try:
            native = {"tools": request.tools} if request.tools else {}
            text = llm.tokenizer.apply_chat_template(
                chat_messages(request.messages, native=bool(request.tools)), tokenize=False,
                add_generation_prompt=True, **native)
        except Exception as exc:  # no template, or one that rejects the conversation
            raise BackendError(f"{self.model}: the chat template failed: {exc}") from exc
        try:
            return list(llm.tokenizer.encode(text, add_special_tokens=False))  # the template wrote BOS
        except Exception as exc:
            raise BackendError(f"{self.model}: the tokenizer failed: {exc}") from exc

    def _sampling_params(self, request: GenerationRequest) -> Any:
        options: dict[str, Any] = {
            "max_tokens": request.max_tokens,  # the API's default is 32
            "temperature": request.temperature,
            "add_special_tokens": False,  # the chat template writes BOS itself
            **self.sampling_options,
        }
        if request.stop:
            options["stop"] = list(request.stop)
        if request.top_p is not None:
            options["top_p"] = request.top_p
        if request.seed is not None:
            options["seed"] = request.seed
        if request.response_schema is not None and self.guided_decoding_backend:
            options["guided_decoding"] = self._api["GuidedDecodingParams"](
                json=json.dumps(request.response_schema))
        elif request.tools and self.guided_decoding_backend == "xgrammar":
            # Native calls: each one constrained to a tool of the run and its schema (tool_call_text.py).
            options["guided_decoding"] = self._api["GuidedDecodingParams"](
                structural_tag=tool_call_text.structural_tag(request.tools))
        try:
            return self._api["SamplingParams"](**options)
        except (TypeError, ValueError) as exc:  # a sampling option this release does not have
            raise BackendError(f"TensorRT-LLM SamplingParams: {exc}") from exc

    def _engine_error(self, exc: BaseException) -> BackendError:
        error = engine_error(exc, closing=self._closing)
        if error.fatal and self._dead is None:
            self._dead = str(error)
            log.error("%s; every request now fails until the worker restarts", error)
        return error

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[Delta | Final, None]:
        """Stream one chat completion; closing this iterator (or cancelling its task) aborts the request
        in the engine, freeing its batch slot."""
        if self._dead is not None:
            raise BackendError(self._dead, fatal=True)
        llm = self._llm
        if llm is None:
            raise BackendError("TensorRT-LLM backend is not started", retriable=True)
        prompt_ids = self._prompt_ids(llm, request)
        refusal = self.limits.refusal(len(prompt_ids), request.max_tokens)
        if refusal is not None:
            raise BackendError(f"{self.model}: {refusal}")
        params = self._sampling_params(request)
        started = time.perf_counter()
        try:
            result = llm.generate_async(prompt_ids, sampling_params=params, streaming=True)
        except Exception as exc:
            raise self._engine_error(exc) from exc
        self._active.add(result)
        self._idle.clear()
        stops = tuple(request.stop)
        shown: list[str] = []  # deltas yielded
        pending = ""  # streamed, held back: it may be the start of a stop string
        ttft_ms = 0.0
        try:
            try:
                async for out in result:
                    diff = out.outputs[0].text_diff
                    if not diff:
                        continue
                    if not ttft_ms:
                        ttft_ms = (time.perf_counter() - started) * 1000
                    pending += diff
                    ready = len(pending) - held_back(pending, stops)
                    if ready > 0:
                        shown.append(pending[:ready])
                        pending = pending[ready:]
                        yield Delta(shown[-1])
            except Exception as exc:
                raise self._engine_error(exc) from exc
        finally:
            self._active.discard(result)
            if not self._active:
                self._idle.set()
            if not result.finished:  # cancelled, aclose()d or failed: free the slot now
                _abort(result)
        output = result.outputs[0]
        so_far = "".join(shown)
        text = output.text if output.text is not None else so_far + pending
        if len(text) > len(so_far) and text.startswith(so_far):
            yield Delta(text[len(so_far):])  # held-back text the engine kept (no stop string after all)
        extra: dict[str, Any] = {}
        if (stop_reason := getattr(output, "stop_reason", None)) is not None:
            extra["stop_reason"] = stop_reason  # the stop string or token that ended it
        if (per_iter := getattr(result, "avg_decoded_tokens_per_iter", None)) is not None:
            extra["avg_decoded_tokens_per_iter"] = per_iter  # > 1 when speculative decoding accepts drafts
        cached = getattr(result, "cached_tokens", None)  # from 1.1; unknown before (never 0 instead)
        calls: tuple[ToolCall, ...] = ()
        if request.tools:  # native tool calling: the template taught the model a call format; read it back
            text, calls = tool_call_text.parse(text)
        yield Final(
            text=text,
            tool_calls=calls,
            finish_reason=_FINISH.get(output.finish_reason or "", "cancelled"),
            prompt_tokens=len(result.prompt_token_ids or ()),
            completion_tokens=len(output.token_ids or ()),
            cached_prompt_tokens=cached if isinstance(cached, int) else None,
            ttft_ms=ttft_ms,
            model=self.model,
            extra=extra,
        )


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _abort(result: Any) -> None:
    """Cancel a request in the engine; best effort (the executor may already be gone)."""
    try:
        result.abort()
    except Exception:
        pass
