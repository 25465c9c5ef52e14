"""What the TensorRT-LLM backend asks of the installed TensorRT-LLM, checked before the model loads.

Why up front: loading a model takes minutes (weights, CUDA graphs, KV allocation), and TensorRT-LLM's
config classes are pydantic models that forbid unknown fields, so an option spelled for another release
fails only then, deep in a traceback. Everything here is decided from the options alone (``__init__``)
or from the installed classes' declared fields (``start``), not from a version table of our own (the
backend reads the version once, for ``cached_tokens``, which no config class declares):

* speculative decoding: the draft model's field is ``speculative_model_dir`` in the 1.0 releases and
  ``speculative_model`` later (which still accepts the old name as an alias); the name the installed
  ``DecodingBaseConfig`` declares is the one passed. ``lookahead`` is refused: its config belongs to the
  TensorRT-engine backend, and ``tensorrt_llm.LLM`` is the PyTorch backend;
* ``static_batch`` scheduling is refused: the PyTorch backend's capacity scheduler offers only
  ``max_utilization`` and ``guaranteed_no_evict``;
* a conversation that cannot fit (``ContextLimits``) is refused before the engine sees it, with the
  figures, instead of the engine's own error (or, with chunked prefill off, a prompt longer than one
  engine step's token budget).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentstream.streams.core.errors import BackendError

#: ``speculative["kind"]`` -> config classes to try, in order, in ``tensorrt_llm.llmapi`` (then
#: ``tensorrt_llm.llmapi.llm_args``, where newer classes such as ``Eagle3DecodingConfig`` live first).
SPECULATIVE: dict[str, tuple[str, ...]] = {
    "eagle3": ("Eagle3DecodingConfig", "EagleDecodingConfig"),
    "eagle": ("EagleDecodingConfig",),
    "mtp": ("MTPDecodingConfig",),
    "ngram": ("NGramDecodingConfig",),
    "draft_target": ("DraftTargetDecodingConfig",),
}
#: Kinds TensorRT-LLM has but ``tensorrt_llm.LLM`` (PyTorch) cannot run, and why.
REFUSED_SPECULATIVE = {
    "lookahead": "lookahead decoding runs only on the TensorRT-engine backend (tensorrt_llm._tensorrt_engine.LLM "
                 "with a built engine), not on tensorrt_llm.LLM, the PyTorch backend this service uses; "
                 "use ngram for draft-model-free speculation",
}
#: ``CapacitySchedulerPolicy`` members accepted for ``scheduler_policy``.
POLICIES = ("max_utilization", "guaranteed_no_evict")
REFUSED_POLICIES = {
    "static_batch": "static batching is not offered by the PyTorch backend's scheduler (and would hold every "
                    "slot until the longest request of a batch ends); use guaranteed_no_evict",
}
#: The two spellings of the draft model's field (1.0 releases, later ones).
DRAFT_MODEL_FIELDS = ("speculative_model", "speculative_model_dir")


def check_policy(policy: str | None) -> None:
    """Raise ``ValueError`` for a scheduler policy the PyTorch backend does not have."""
    if policy is None:
        return
    name = policy.lower()
    if name in REFUSED_POLICIES:
        raise ValueError(f"scheduler_policy {policy!r} is refused: {REFUSED_POLICIES[name]}")
    if name not in POLICIES:
        raise ValueError(f"scheduler_policy must be one of {', '.join(POLICIES)}")


def check_speculative_kind(speculative: dict[str, Any] | None) -> None:
    """Raise ``ValueError`` for a speculative kind that is unknown or that ``tensorrt_llm.LLM`` cannot run."""
    if speculative is None:
        return
    kind = speculative.get("kind")
    if isinstance(kind, str) and kind in REFUSED_SPECULATIVE:
        raise ValueError(f"speculative kind {kind!r} is refused: {REFUSED_SPECULATIVE[kind]}")
    if kind not in SPECULATIVE:
        raise ValueError(f"speculative['kind'] must be one of {', '.join(SPECULATIVE)}")
    drafts = [name for name in DRAFT_MODEL_FIELDS if name in speculative]
    if len(drafts) > 1:
        raise ValueError("speculative: give the draft model once, as speculative_model")


def declared_fields(cls: Any) -> frozenset[str] | None:
    """The fields a pydantic model class declares (``model_fields``), or None for a class that is not
    one (nothing to check against)."""
    fields = getattr(cls, "model_fields", None)
    return frozenset(fields) if isinstance(fields, dict) else None


def speculative_config(modules: list[Any], speculative: dict[str, Any]) -> Any:
    """The decoding config object for ``speculative`` (``{"kind": ..., **fields}``), built from the first
    of the kind's classes found in ``modules``, with the draft model under the field name that class
    declares and every other key checked against its declared fields."""
    options = dict(speculative)
    kind = options.pop("kind")
    for class_name in SPECULATIVE[kind]:
        for module in modules:
            cls = getattr(module, class_name, None)
            if cls is not None:
                return cls(**_fit_fields(cls, options, kind))
    raise BackendError(f"this TensorRT-LLM has no {' or '.join(SPECULATIVE[kind])} for {kind!r}")


def _fit_fields(cls: Any, options: dict[str, Any], kind: str) -> dict[str, Any]:
    fields = declared_fields(cls)
    if fields is None:
        return options
    out = dict(options)
    given = next((name for name in DRAFT_MODEL_FIELDS if name in out), None)
    if given is not None:
        wanted = next((name for name in DRAFT_MODEL_FIELDS if name in fields), None)
        if wanted is None:
            raise BackendError(f"speculative {kind!r}: {cls.__name__} takes no draft model")
        out[wanted] = out.pop(given)
    unknown = sorted(set(out) - fields)
    if unknown:
        raise BackendError(f"speculative {kind!r}: {cls.__name__} of this TensorRT-LLM has no field "
                           f"{', '.join(unknown)} (it has {', '.join(sorted(fields))})")
    return out


def check_llm_fields(llm_args_cls: Any, kwargs: dict[str, Any]) -> None:
    """Raise ``BackendError`` when the installed ``TorchLlmArgs`` does not declare one of ``kwargs``: the
    same refusal ``LLM(...)`` would give, before the weights load rather than after."""
    fields = declared_fields(llm_args_cls)
    if fields is None:
        return
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise BackendError(f"this TensorRT-LLM's LLM takes no {', '.join(unknown)}; see docs/gpu.md for the "
                           f"version this backend is written against")


@dataclass(frozen=True)
class ContextLimits:
    """The engine's per-sequence limits, as the loaded engine reports them (None: not reported).

    ``max_seq_len`` bounds prompt + generated tokens of one sequence; ``max_num_tokens`` bounds the tokens
    of one engine step, and so the prompt itself unless chunked prefill splits it over several steps."""

    max_seq_len: int | None
    max_num_tokens: int | None
    chunked_prefill: bool

    def refusal(self, prompt_tokens: int, max_tokens: int) -> str | None:
        """Why a request of ``prompt_tokens`` that may generate ``max_tokens`` cannot run, or None."""
        if self.max_seq_len is not None and prompt_tokens + max_tokens > self.max_seq_len:
            return (f"the conversation does not fit: {prompt_tokens} prompt tokens + {max_tokens} max_tokens "
                    f"> max_seq_len {self.max_seq_len} (shorten the conversation or raise max_seq_len)")
        if not self.chunked_prefill and self.max_num_tokens is not None and prompt_tokens > self.max_num_tokens:
            return (f"the prompt does not fit one engine step: {prompt_tokens} prompt tokens > max_num_tokens "
                    f"{self.max_num_tokens} with chunked prefill off (turn it on or raise max_num_tokens)")
        return None


def version_tuple(text: str) -> tuple[int, int]:
    """``"1.0.0rc4"`` -> (1, 0): the release line, for what the installed classes cannot tell."""
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)
