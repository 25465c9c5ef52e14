"""The TensorRT-LLM backend's sequence limits: ``TrtLlmSettings``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentstream.streams.config import env


@dataclass(frozen=True, kw_only=True)
class TrtLlmSettings:
    """The TensorRT-LLM backend's sequence limits (``agentstream worker inference --backend trtllm``;
    its command-line options win over these). None keeps the engine's own default: ``max_seq_len`` the
    model's context length, ``max_num_tokens`` TensorRT-LLM's per-step budget. Chunked prefill is on unless
    turned off: without it a prompt longer than ``max_num_tokens`` is refused, and an agent's conversation
    grows past that step after step (docs/gpu.md says what each costs)."""

    max_seq_len: int | None = None
    max_num_tokens: int | None = None
    chunked_prefill: bool = True

    @classmethod
    def load(cls) -> TrtLlmSettings:
        """``AGENTSTREAM_TRTLLM_MAX_SEQ_LEN``, ``AGENTSTREAM_TRTLLM_MAX_NUM_TOKENS``,
        ``AGENTSTREAM_TRTLLM_CHUNKED_PREFILL`` (``0``/``off`` turns it off)."""
        return cls(max_seq_len=env.optional_positive_int("AGENTSTREAM_TRTLLM_MAX_SEQ_LEN"),
                   max_num_tokens=env.optional_positive_int("AGENTSTREAM_TRTLLM_MAX_NUM_TOKENS"),
                   chunked_prefill=env.flag("AGENTSTREAM_TRTLLM_CHUNKED_PREFILL", True))

    def backend_options(self) -> dict[str, Any]:
        """Keyword arguments for ``TrtLlmBackend``: only what is set, so the backend's defaults stay its own."""
        options: dict[str, Any] = {"enable_chunked_prefill": self.chunked_prefill}
        if self.max_seq_len is not None:
            options["max_seq_len"] = self.max_seq_len
        if self.max_num_tokens is not None:
            options["max_num_tokens"] = self.max_num_tokens
        return options
