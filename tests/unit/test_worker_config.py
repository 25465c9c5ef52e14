"""A worker asked for something that does not exist fails with ``ConfigError`` (never ``SystemExit``
from library code); the ``agentstream`` command prints it as one line and exits 2."""

from __future__ import annotations

import sys

import pytest

from agentstream.services import worker as worker_module
from agentstream.services.worker import Worker, make_backend
from agentstream.streams.config.identity import Identity
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import ConfigError


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


@pytest.mark.parametrize(("argv", "env", "expected"), [
    ([], {}, {"enable_chunked_prefill": True}),
    (["--max-seq-len", "32768", "--no-chunked-prefill"], {"AGENTSTREAM_TRTLLM_MAX_NUM_TOKENS": "4096"},
     {"enable_chunked_prefill": False, "max_seq_len": 32768, "max_num_tokens": 4096}),
    (["--max-num-tokens", "2048", "--chunked-prefill"],
     {"AGENTSTREAM_TRTLLM_MAX_NUM_TOKENS": "4096", "AGENTSTREAM_TRTLLM_CHUNKED_PREFILL": "off"},
     {"enable_chunked_prefill": True, "max_num_tokens": 2048}),
])
def test_trtllm_limits_from_options_then_environment(monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                     env: dict[str, str], expected: dict[str, object]) -> None:
    from typer.testing import CliRunner

    from agentstream import cli

    for name in ("AGENTSTREAM_TRTLLM_MAX_SEQ_LEN", "AGENTSTREAM_TRTLLM_MAX_NUM_TOKENS",
                 "AGENTSTREAM_TRTLLM_CHUNKED_PREFILL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    seen: list[worker_module.WorkerOptions] = []

    async def serve(names: list[str], options: worker_module.WorkerOptions, settings: Settings) -> None:
        seen.append(options)
        assert settings.identity == Identity(principal="inference")  # the command decides who the process is

    monkeypatch.setattr(worker_module, "serve", serve)
    result = CliRunner().invoke(cli.app, ["worker", "inference", "--backend", "trtllm", "--model", "m", *argv])
    assert result.exit_code == 0, result.output
    assert seen[0].backend_options == {"model": "m", **expected}


def test_a_malformed_trtllm_setting_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentstream.streams.config.trtllm import TrtLlmSettings

    monkeypatch.setenv("AGENTSTREAM_TRTLLM_CHUNKED_PREFILL", "maybe")
    with pytest.raises(ConfigError, match="AGENTSTREAM_TRTLLM_CHUNKED_PREFILL='maybe' must be one of"):
        TrtLlmSettings.load()
    monkeypatch.setenv("AGENTSTREAM_TRTLLM_CHUNKED_PREFILL", "1")
    monkeypatch.setenv("AGENTSTREAM_TRTLLM_MAX_SEQ_LEN", "-5")
    with pytest.raises(ConfigError, match="must be a positive integer"):
        TrtLlmSettings.load()
