"""The public API is pinned: adding or removing a name from ``agentstream.__all__`` is a decision made
here, on purpose. Every name resolves, every error has the one root, and what type checkers see (the
``TYPE_CHECKING`` imports) is what ``__getattr__`` returns at run time."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import agentstream
from agentstream.streams.core.errors import AgentStreamError

PINNED = [
    "Agent", "AgentClient", "AgentRejected", "AgentStreamError", "BackendError", "ClaimMissing", "Codec", "ConfigError", "DeadLetterError",
    "DecodeError", "EVENT_TYPES", "Event", "EventTooLarge", "Message", "MigrationError", "MissingExtra",
    "Pipeline", "RecordedEvent", "ReplayError", "RunCompleted", "RunDetails", "RunFailed", "RunResult",
    "RunStatus", "Settings", "StackError", "StepDetails", "StepKind",
    "TaskRejected", "TaskSubmitted", "TokenChunk", "TokenEvent", "ToolArgumentError", "ToolCatalogUnavailable",
    "ToolContext", "ToolError", "TopicMismatch", "TopicsMissing", "Unavailable", "UnknownSchema",
    "__version__", "codec_for", "new_run_id", "tool",
]


def test_all_is_pinned() -> None:
    assert sorted(agentstream.__all__) == sorted(PINNED)
    assert set(agentstream.__all__) - {"__version__"} == set(agentstream._EXPORTS)


def test_every_name_resolves_to_its_module() -> None:
    for name in agentstream.__all__:
        value = getattr(agentstream, name)
        if name == "__version__":
            assert isinstance(value, str) and value
            continue
        module = agentstream._EXPORTS[name]
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == module, (name, value.__module__, module)


def test_every_public_error_has_the_one_root() -> None:
    errors = [getattr(agentstream, n) for n in agentstream.__all__ if n.endswith("Error") or n in {
        "TaskRejected", "Unavailable", "EventTooLarge", "ClaimMissing", "UnknownSchema", "TopicsMissing",
        "TopicMismatch", "ToolCatalogUnavailable", "MissingExtra", "AgentRejected"}]
    assert len(errors) == 20
    for error in errors:
        assert issubclass(error, AgentStreamError), error


def test_type_checkers_see_what_runs() -> None:
    """The ``if TYPE_CHECKING:`` imports name the same modules as ``_EXPORTS``."""
    tree = ast.parse(Path(agentstream.__file__).read_text())
    seen: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module
                seen.update({alias.name: stmt.module for alias in stmt.names})
    assert seen == agentstream._EXPORTS


def test_unknown_names_raise_attribute_error() -> None:
    try:
        agentstream.NotAThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NotAThing" in str(exc)
    else:
        raise AssertionError("no AttributeError")


def test_import_is_cheap() -> None:
    """``import agentstream`` loads no Kafka, database or worker library: a client that only needs the
    events pays for nothing else, and a missing extra cannot break the import."""
    code = ("import sys, agentstream; heavy = [m for m in ('aiokafka', 'asyncpg', 'prometheus_client', "
            "'opentelemetry', 'aiohttp', 'faust', 'numpy') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
