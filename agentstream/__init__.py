"""agentstream: AI agents as event streams on Apache Kafka.

This module is the public API: what it exports (``__all__``) is what users build on, and a test pins
the list. Everything else (``agentstream.streams``: the backbone; ``agentstream.services``: the consumer
services; the CLI, dev stack and replay orchestration) may change between releases.

Names are imported on first use (PEP 562), so ``import agentstream`` is cheap and a client installed
without extras never imports a worker's dependencies. A name whose part needs an extra that is not
installed raises ``MissingExtra`` naming it (``pip install 'agentstream[worker]'``).
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    #: The installed distribution's version (PEP 440); ``0+unknown`` in a source tree never installed.
    __version__ = version("agentstream")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # the client and what it returns
    "AgentClient": "agentstream.streams.client.agent_client",
    "TokenEvent": "agentstream.streams.client.views",
    "RunResult": "agentstream.streams.client.outcomes",
    "RunDetails": "agentstream.streams.client.views",
    "StepDetails": "agentstream.streams.client.views",
    "RecordedEvent": "agentstream.streams.client.views",
    "RunStatus": "agentstream.streams.core.kinds",
    "StepKind": "agentstream.streams.core.kinds",
    "Settings": "agentstream.streams.config.settings",
    # agent definitions (registered with `agentstream agent register`, run with submit(agent=...))
    "Agent": "agentstream.streams.core.agents",
    # events, as they travel on the topics
    "Event": "agentstream.streams.core.events",
    "EVENT_TYPES": "agentstream.streams.core.events",
    "Message": "agentstream.streams.core.events",
    "TaskSubmitted": "agentstream.streams.core.events",
    "TokenChunk": "agentstream.streams.core.events",
    "RunCompleted": "agentstream.streams.core.events",
    "RunFailed": "agentstream.streams.core.events",
    "new_run_id": "agentstream.streams.core.ids",
    "Codec": "agentstream.streams.kafka.codec",
    "codec_for": "agentstream.streams.kafka.codec",
    # writing tools ([worker])
    "tool": "agentstream.services.tools.registry",
    "ToolContext": "agentstream.services.tools.registry",
    # testing a pipeline in-process ([worker])
    "Pipeline": "agentstream.testing",
    # errors: one root, AgentStreamError
    "AgentStreamError": "agentstream.streams.core.errors",
    "ConfigError": "agentstream.streams.core.errors",
    "StackError": "agentstream.streams.core.errors",
    "MigrationError": "agentstream.streams.core.errors",
    "Unavailable": "agentstream.streams.core.errors",
    "MissingExtra": "agentstream.streams.core.errors",
    "TaskRejected": "agentstream.streams.core.errors",
    "AgentRejected": "agentstream.streams.core.errors",
    "DecodeError": "agentstream.streams.core.errors",
    "UnknownSchema": "agentstream.streams.core.errors",
    "EventTooLarge": "agentstream.streams.core.errors",
    "ClaimMissing": "agentstream.streams.core.errors",
    "TopicsMissing": "agentstream.streams.core.errors",
    "TopicMismatch": "agentstream.streams.core.errors",
    "ToolCatalogUnavailable": "agentstream.streams.core.errors",
    "DeadLetterError": "agentstream.streams.core.errors",
    "ToolError": "agentstream.streams.core.errors",
    "ToolArgumentError": "agentstream.streams.core.errors",
    "BackendError": "agentstream.streams.core.errors",
    "ReplayError": "agentstream.streams.core.errors",
}

#: The public API, written out (type checkers and linters read it); a test checks it matches _EXPORTS.
__all__ = [
    "EVENT_TYPES",
    "Agent",
    "AgentClient",
    "AgentRejected",
    "AgentStreamError",
    "BackendError",
    "ClaimMissing",
    "Codec",
    "ConfigError",
    "DeadLetterError",
    "DecodeError",
    "Event",
    "EventTooLarge",
    "Message",
    "MigrationError",
    "MissingExtra",
    "Pipeline",
    "RecordedEvent",
    "ReplayError",
    "RunCompleted",
    "RunDetails",
    "RunFailed",
    "RunResult",
    "RunStatus",
    "Settings",
    "StackError",
    "StepDetails",
    "StepKind",
    "TaskRejected",
    "TaskSubmitted",
    "TokenChunk",
    "TokenEvent",
    "ToolArgumentError",
    "ToolCatalogUnavailable",
    "ToolContext",
    "ToolError",
    "TopicMismatch",
    "TopicsMissing",
    "Unavailable",
    "UnknownSchema",
    "__version__",
    "codec_for",
    "new_run_id",
    "tool",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentstream' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as exc:
        from agentstream.streams.core.extras import missing_extra

        missing = missing_extra(exc, f"agentstream.{name}")
        if missing is None:
            raise
        raise missing from exc
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # what type checkers and IDEs see; __getattr__ does the same at run time
    from agentstream.services.tools.registry import ToolContext, tool
    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.client.outcomes import RunResult
    from agentstream.streams.client.views import RecordedEvent, RunDetails, StepDetails, TokenEvent
    from agentstream.streams.config.settings import Settings
    from agentstream.streams.core.agents import Agent
    from agentstream.streams.core.errors import (
        AgentRejected,
        AgentStreamError,
        BackendError,
        ClaimMissing,
        ConfigError,
        DeadLetterError,
        DecodeError,
        EventTooLarge,
        MigrationError,
        MissingExtra,
        ReplayError,
        StackError,
        TaskRejected,
        ToolArgumentError,
        ToolCatalogUnavailable,
        ToolError,
        TopicMismatch,
        TopicsMissing,
        Unavailable,
        UnknownSchema,
    )
    from agentstream.streams.core.events import (
        EVENT_TYPES,
        Event,
        Message,
        RunCompleted,
        RunFailed,
        TaskSubmitted,
        TokenChunk,
    )
    from agentstream.streams.core.ids import new_run_id
    from agentstream.streams.core.kinds import RunStatus, StepKind
    from agentstream.streams.kafka.codec import Codec, codec_for
    from agentstream.testing import Pipeline
