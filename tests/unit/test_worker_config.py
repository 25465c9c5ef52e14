"""A worker asked for something that does not exist fails with ``ConfigError`` (never ``SystemExit``
from library code); the ``agentstream`` command prints it as one line and exits 2."""

from __future__ import annotations

import sys

import pytest

from agentstream.services import worker as worker_module
from agentstream.services.worker import Worker, make_backend
from agentstream.streams.errors import ConfigError


def test_unknown_backend() -> None:
    with pytest.raises(ConfigError, match="unknown backend 'nope'; choose one of scripted, llamacpp"):
        make_backend("nope")


def test_backend_whose_dependencies_are_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(worker_module.BACKENDS, "absent", ("agentstream_absent_module", "Backend", "the absent engine"))
    with pytest.raises(ConfigError, match="the absent backend needs the absent engine") as caught:
        make_backend("absent")
    assert isinstance(caught.value.__cause__, ImportError)


def test_unknown_service() -> None:
    with pytest.raises(ConfigError, match=r"unknown service\(s\) nope; choose from planner, inference"):
        Worker(["planner", "nope"])  # refused before any setting is read or connection made


def test_the_command_prints_one_line_and_exits_2(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from agentstream.cli import main

    monkeypatch.setattr(sys, "argv", ["agentstream", "worker", "nope", "--backend", "scripted"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: unknown service(s) nope; choose from planner, inference, retrieval, tools"]
