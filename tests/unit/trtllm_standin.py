"""A strict stand-in for the ``tensorrt_llm`` package (1.0, 1.1, 1.2), for tests without a GPU.

It fails where the real library fails, so a test that passes here does not just pass because the fake is
lenient. What it mirrors, by release (read in TensorRT-LLM's sources: ``tensorrt_llm/llmapi/llm.py``,
``llmapi/llm_args.py``, ``sampling_params.py``, ``executor/result.py``):

* config classes are pydantic models that forbid unknown fields (``StrictBaseModel``): the fields listed
  here are real ones of each class (the part a caller of the LLM API may touch, not all of them), and
  anything else is refused with a ``ValueError`` (pydantic's ``ValidationError`` is one);
* the draft model's field: ``speculative_model_dir`` in 1.0; ``speculative_model`` from 1.1, which
  also accepts ``speculative_model_dir`` (a validation alias); ``model_fields`` lists the declared names;
* ``SamplingParams`` is a keyword-only dataclass: an unknown keyword is a ``TypeError``;
* ``LLM.generate_async`` raises ``RuntimeError("LLM is shutting down")`` itself once the executor is shut
  down (not while a stream is iterated), and ``ValueError("The sum of prompt length ... should not exceed
  max_num_tokens ...")`` for a prompt longer than ``max_num_tokens`` when chunked prefill is off (its
  default); a prompt that leaves no room under ``max_seq_len`` fails the request (``RequestError``) and
  ``max_tokens`` beyond the room left is cut to it;
* ``abort()`` is followed by one final response, ``finish_reason="cancelled"``;
* a stop string ends the request with ``finish_reason="stop"``: the final ``text`` and ``token_ids`` drop
  it, while the text streamed before that step may already hold its first part (``text_diff`` is what
  ``text`` gained since the previous step, empty when it shrank);
* ``RequestOutput.cached_tokens`` only from 1.1; iteration statistics (``get_stats``, cumulative
  ``kvCacheStats``) only with ``enable_iter_perf_stats``.

Tokens are characters (``encode`` maps each to its code point), so lengths in tests are plain to read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import types
from typing import Any, ClassVar

VERSIONS = ("1.0", "1.1", "1.2")
TOKENS_PER_BLOCK = 32
#: What the engine takes per step when ``max_num_tokens`` is not given (``BaseLlmArgs`` default).
DEFAULT_MAX_NUM_TOKENS = 8192
#: The stand-in model's context length (the engine's ``max_seq_len`` when not given).
MODEL_CONTEXT = 4096

_LLM_FIELDS = frozenset({
    "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code", "tensor_parallel_size",
    "pipeline_parallel_size", "dtype", "revision", "max_batch_size", "max_num_tokens", "max_seq_len",
    "max_input_len", "max_beam_width", "enable_chunked_prefill", "kv_cache_config", "scheduler_config",
    "speculative_config", "guided_decoding_backend", "enable_iter_perf_stats", "enable_iter_req_stats",
    "return_perf_metrics", "backend",
})
_KV_CACHE_FIELDS = frozenset({
    "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length", "free_gpu_memory_fraction",
    "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction", "secondary_offload_min_priority",
    "event_buffer_max_size", "enable_partial_reuse", "copy_on_partial_reuse",
})
_SCHEDULER_FIELDS = frozenset({"capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config"})
_GUIDED_FIELDS = frozenset({"json", "regex", "grammar", "json_object", "structural_tag"})
_DECODING_BASE = {"1.0": frozenset({"max_draft_len", "speculative_model_dir"}),
                  "1.1": frozenset({"max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency"}),
                  "1.2": frozenset({"max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency"})}
_ALIASES = {"1.0": {}, "1.1": {"speculative_model_dir": "speculative_model"},
            "1.2": {"speculative_model_dir": "speculative_model"}}
_DECODING = {
    "EagleDecodingConfig": frozenset({"eagle_choices", "greedy_sampling", "posterior_threshold", "use_dynamic_tree",
                                      "dynamic_tree_max_topK", "num_eagle_layers", "max_non_leaves_per_layer",
                                      "eagle3_one_model"}),
    "MTPDecodingConfig": frozenset({"num_nextn_predict_layers", "use_relaxed_acceptance_for_thinking",
                                    "relaxed_topk", "relaxed_delta"}),
    "NGramDecodingConfig": frozenset({"max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool"}),
    "DraftTargetDecodingConfig": frozenset(),
    "LookaheadDecodingConfig": frozenset({"max_window_size", "max_ngram_size", "max_verification_set_size"}),
}


class StrictModel:
    """A pydantic model with ``extra="forbid"``: declared fields (``model_fields``), aliases, nothing else."""

    model_fields: ClassVar[dict[str, Any]] = {}
    aliases: ClassVar[dict[str, str]] = {}

    def __init__(self, **kwargs: Any) -> None:
        values: dict[str, Any] = {}
        for key, value in kwargs.items():
            name = self.aliases.get(key, key)
            if name not in self.model_fields:
                raise ValueError(f"1 validation error for {type(self).__name__}\n{key}\n  Extra inputs are not "
                                 f"permitted [type=extra_forbidden]")
            values[name] = value
        self.kwargs = values


def _model(name: str, fields: frozenset[str], aliases: dict[str, str] | None = None) -> type[StrictModel]:
    return type(name, (StrictModel,), {"model_fields": dict.fromkeys(fields), "aliases": dict(aliases or {})})


class CapacitySchedulerPolicy(enum.Enum):
    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


class RequestError(RuntimeError):
    """``tensorrt_llm.llmapi.RequestError``: one request failed in the executor."""


@dataclasses.dataclass(slots=True, kw_only=True)
class SamplingParams:
    """The real class's fields (``sampling_params.py``, 1.0): a keyword-only dataclass."""

    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    bad: Any = None
    bad_token_ids: Any = None
    stop: Any = None
    stop_token_ids: Any = None
    include_stop_str_in_output: bool = False
    embedding_bias: Any = None
    logits_processor: Any = None
    apply_batched_logits_processor: bool = False
    n: int = 1
    best_of: int | None = None
    use_beam_search: bool = False
    top_k: int | None = None
    top_p: float | None = None
    top_p_min: float | None = None
    top_p_reset_ids: int | None = None
    top_p_decay: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_tokens: int | None = None
    beam_search_diversity_rate: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    early_stopping: int | None = None
    no_repeat_ngram_size: int | None = None
    min_p: float | None = None
    beam_width_array: Any = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    return_context_logits: bool = False
    return_generation_logits: bool = False
    exclude_input_from_output: bool = True
    return_encoder_output: bool = False
    return_perf_metrics: bool = False
    additional_model_outputs: Any = None
    lookahead_config: Any = None
    guided_decoding: Any = None
    ignore_eos: bool = False
    detokenize: bool = True
    add_special_tokens: bool = True
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or ())


class Tokenizer:
    """One token per character; records the chat template's calls."""

    def __init__(self) -> None:
        self.template_calls: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        self.template_calls.append((messages, kwargs))
        return "".join(f"<|{m['role']}|>{m['content']}" for m in messages) + "<|assistant|>"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([1] if add_special_tokens else []) + [ord(c) for c in text]


class CompletionOutput:
    def __init__(self) -> None:
        self.text = ""
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self._last_text_len = 0

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len:]


HANG = object()  # a script step that never comes (the engine is still computing), until abort()


class RequestOutput:
    """One streaming request: plays its script of ``(text, n_tokens, finish_reason)`` steps, ``HANG`` or
    an exception (raised while iterating)."""

    def __init__(self, engine: Engine, prompt_ids: list[int], params: SamplingParams, script: list[Any],
                 cached: int, error: BaseException | None) -> None:
        self._engine = engine
        self.prompt_token_ids = prompt_ids
        self.outputs = [CompletionOutput()]
        self.finished = False
        self.aborts = 0
        self._params = params
        self._script = list(script)
        self._error = error
        self._aborted = asyncio.Event()
        if engine.version != "1.0":
            self.cached_tokens = cached

    def abort(self) -> None:
        self.aborts += 1
        self._aborted.set()

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        out = self.outputs[0]
        out._last_text_len = len(out.text)
        if self._error is not None:
            raise self._error
        if self._engine.dead is not None:
            raise RuntimeError(self._engine.dead)
        step = self._script.pop(0) if self._script and not self._aborted.is_set() else HANG
        if step is HANG:
            waiter = asyncio.ensure_future(self._aborted.wait())
            died = asyncio.ensure_future(self._engine.died.wait())
            await asyncio.wait([waiter, died], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            died.cancel()
            if self._engine.dead is not None and not self._aborted.is_set():
                raise RuntimeError(self._engine.dead)
            out.finish_reason, self.finished = "cancelled", True  # the final response after abort()
            return self
        if isinstance(step, BaseException):
            raise step
        text, n_tokens, finish = step
        out.text += text
        out.token_ids += [7] * n_tokens
        for stop in self._params.stops():
            at = out.text.find(stop)
            if at >= 0:
                keep = at + (len(stop) if self._params.include_stop_str_in_output else 0)
                out.token_ids = out.token_ids[: max(0, len(out.token_ids) - (len(out.text) - keep))]
                out.text = out.text[:keep]
                out.finish_reason, out.stop_reason, self.finished = "stop", stop, True
                return self
        if len(out.token_ids) >= self._params.max_tokens and not finish:
            finish = "length"
        if finish:
            out.finish_reason, self.finished = finish, True
        return self


class Engine:
    """What the fake ``LLM`` shares with its results and the test: scripts, death, statistics."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.script: list[Any] = [("Hel", 1, None), ("", 1, None), ("lo", 1, None), (" world", 2, "stop")]
        self.dead: str | None = None
        self.died = asyncio.Event()
        self.shut_down = False
        self.prompts: list[list[int]] = []
        self.reused_blocks = 0
        self.missed_blocks = 0

    def die(self, message: str = "CUDA error: an illegal memory access was encountered") -> None:
        """An internal error: in-flight requests fail with it, the executor shuts down."""
        self.dead = message
        self.shut_down = True
        self.died.set()

    def cached(self, prompt: list[int]) -> int:
        """Prompt tokens found in reused KV blocks: the longest prefix shared with an earlier prompt, in
        whole blocks."""
        best = 0
        for earlier in self.prompts:
            n = 0
            for a, b in zip(earlier, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        blocks = best // TOKENS_PER_BLOCK
        self.reused_blocks += blocks
        self.missed_blocks += -(-len(prompt) // TOKENS_PER_BLOCK) - blocks
        self.prompts.append(prompt)
        return blocks * TOKENS_PER_BLOCK


class Fake:
    """The ``tensorrt_llm`` package of one release, and what it recorded."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.engine = Engine(version)
        self.tokenizer = Tokenizer()
        self.llm_kwargs: dict[str, Any] | None = None
        self.calls: list[dict[str, Any]] = []
        self.results: list[RequestOutput] = []
        self.shutdowns = 0
        fake = self
        base = _DECODING_BASE[version]
        aliases = _ALIASES[version]
        self.llm_args = types.ModuleType("tensorrt_llm.llmapi.llm_args")
        self.llm_args.TorchLlmArgs = _model("TorchLlmArgs", _LLM_FIELDS)
        self.llmapi = types.ModuleType("tensorrt_llm.llmapi")
        self.llmapi.llm_args = self.llm_args
        self.llmapi.KvCacheConfig = _model("KvCacheConfig", _KV_CACHE_FIELDS)
        self.llmapi.SchedulerConfig = _model("SchedulerConfig", _SCHEDULER_FIELDS)
        self.llmapi.GuidedDecodingParams = _model("GuidedDecodingParams", _GUIDED_FIELDS)
        self.llmapi.CapacitySchedulerPolicy = CapacitySchedulerPolicy
        self.llmapi.RequestError = RequestError
        for name, fields in _DECODING.items():
            setattr(self.llmapi, name, _model(name, base | fields, aliases))

        class LLM:
            def __init__(self, **kwargs: Any) -> None:
                args = fake.llm_args.TorchLlmArgs(**kwargs)  # what LLM(...) validates its arguments with
                if "speculative_config" in kwargs and isinstance(kwargs["speculative_config"],
                                                                 fake.llmapi.LookaheadDecodingConfig):
                    raise ValueError("Lookahead decoding is not supported by the PyTorch backend")
                policy = getattr(kwargs.get("scheduler_config"), "kwargs", {}).get("capacity_scheduler_policy")
                if policy is CapacitySchedulerPolicy.STATIC_BATCH:
                    raise ValueError("STATIC_BATCH is not supported by the PyTorch backend")
                fake.llm_kwargs = kwargs
                self.args = types.SimpleNamespace(
                    max_num_tokens=args.kwargs.get("max_num_tokens", DEFAULT_MAX_NUM_TOKENS),
                    max_seq_len=args.kwargs.get("max_seq_len"),  # None: the model's, decided in the executor
                    enable_chunked_prefill=args.kwargs.get("enable_chunked_prefill", False),
                    enable_iter_perf_stats=args.kwargs.get("enable_iter_perf_stats", False))
                self.tokenizer = fake.tokenizer

            def generate_async(self, inputs: Any, sampling_params: Any = None, streaming: bool = False) -> RequestOutput:
                engine = fake.engine
                if engine.shut_down:
                    raise RuntimeError("LLM is shutting down")
                if not isinstance(sampling_params, SamplingParams):
                    raise TypeError("sampling_params must be a SamplingParams")
                ids = list(inputs) if isinstance(inputs, list) else fake.tokenizer.encode(inputs)
                fake.calls.append({"inputs": inputs, "params": sampling_params, "streaming": streaming})
                if not self.args.enable_chunked_prefill and len(ids) > self.args.max_num_tokens:
                    raise ValueError(f"The sum of prompt length ({float(len(ids))}), query length (0) should not "
                                     f"exceed max_num_tokens ({self.args.max_num_tokens})")
                max_seq_len = self.args.max_seq_len or MODEL_CONTEXT
                error = None
                if max_seq_len - len(ids) <= 0:
                    room = max_seq_len - len(ids)
                    error = RequestError(f"`default_max_tokens` ({room}) must be greater than 0")
                elif sampling_params.max_tokens > max_seq_len - len(ids):
                    sampling_params.max_tokens = max_seq_len - len(ids)  # cut, with a warning, as the executor does
                result = RequestOutput(engine, ids, sampling_params, engine.script, engine.cached(ids), error)
                fake.results.append(result)
                return result

            def get_stats(self, timeout: float = 2) -> list[dict[str, Any]]:
                if not self.args.enable_iter_perf_stats:
                    return []
                engine = fake.engine
                return [{"iter": len(engine.prompts), "kvCacheStats": {
                    "reusedBlocks": engine.reused_blocks, "missedBlocks": engine.missed_blocks,
                    "tokensPerBlock": TOKENS_PER_BLOCK,
                    "cacheHitRate": engine.reused_blocks / max(1, engine.reused_blocks + engine.missed_blocks)}}]

            def shutdown(self) -> None:
                fake.shutdowns += 1
                fake.engine.shut_down = True

        self.package = types.ModuleType("tensorrt_llm")
        self.package.__version__ = {"1.0": "1.0.0", "1.1": "1.1.0", "1.2": "1.2.1"}[version]
        self.package.LLM = LLM
        self.package.SamplingParams = SamplingParams
        self.package.llmapi = self.llmapi

    @property
    def params(self) -> SamplingParams:
        params = self.calls[-1]["params"]
        assert isinstance(params, SamplingParams)
        return params
