"""One module of public errors, one tree; the runtime's flow-control signals outside it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import agentstream
from agentstream.streams.core import errors, signals

REPO = Path(__file__).resolve().parents[2]
SOURCES = [p for folder in ("streams", "services", "agentstream") for p in (REPO / folder).rglob("*.py")
           if not p.is_symlink() and "streams" not in p.relative_to(REPO).parts[1:2]]


def _error_classes() -> set[str]:
    return {name for name, obj in vars(errors).items()
            if inspect.isclass(obj) and issubclass(obj, errors.AgentStreamError)}


def test_every_error_class_is_defined_in_the_errors_module() -> None:
    """A subclass of any public error defined elsewhere would be a second place to look."""
    known = _error_classes()
    elsewhere = []
    for path in SOURCES:
        if path == REPO / "streams" / "core" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                if bases & known:
                    elsewhere.append(f"{path.relative_to(REPO)}: {node.name}")
    assert elsewhere == []


def test_every_public_error_is_exported_from_the_errors_module() -> None:
    exported = {n for n in agentstream.__all__ if n in _error_classes()}
    assert exported, "the public API exports errors"
    for name in exported:
        assert getattr(agentstream, name).__module__ == errors.__name__


def test_signals_are_not_errors_users_catch() -> None:
    for cls in (signals.Abandoned, signals.Deferred, signals.Fenced):
        assert not issubclass(cls, errors.AgentStreamError)
        assert issubclass(cls, signals.Signal)
    assert issubclass(signals.Fenced, signals.Abandoned)
