"""Each module has one identity: the repository's top-level folders are reached through ``agentstream``
only, so an error class is one object and ``except AgentStreamError`` catches it wherever it came from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("bare", "right"), [
    ("streams.core.errors", "agentstream.streams"),
    ("streams", "agentstream.streams"),
    ("services.planner.service", "agentstream.services"),
])
def test_a_bare_import_fails_at_once_naming_the_right_one(bare: str, right: str) -> None:
    """With the repository root first on ``sys.path`` (pytest, bench/), as an editor's auto-import would."""
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); import {bare}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert out.returncode != 0
    assert "ImportError" in out.stderr and f"import {right} (the package)" in out.stderr


def test_errors_raised_anywhere_are_caught_by_the_public_root(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentstream
    from agentstream.streams.config.settings import Settings
    from agentstream.streams.core import errors

    monkeypatch.setenv("AGENTSTREAM_PARTITIONS", "many")
    with pytest.raises(agentstream.AgentStreamError):
        Settings.load()
    assert agentstream.ConfigError is errors.ConfigError
    assert sys.modules.get("streams") is None and sys.modules.get("services") is None
