"""The contract's examples (examples/contract/, shown in docs/contract.md) built with this machine's toolchains
and run against a real pipeline: each publishes a turn of a session from Java, Go, Node or Python (no
agentstream code in them) and must print the run's RunCompleted with its structured output, which the test
checks against the pipeline's own record of the run. Each must also say so and exit non-zero when the run
fails (exit 1) or no outcome comes within its timeout (exit 2). The Python and Node registry variants run through a real
schema registry (Apicurio Registry 3.x, tests/integration/apicurio.py) that the pipeline uses too.

Slow (Maven, the Go module proxy, npm, pip, a JVM for Apicurio): marked ``examples``, outside the default
run; ``make test-examples`` runs them (and CI, after ``make test``). A missing toolchain skips its example
with the reason.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.registry import HttpRegistry
from agentstream.testing import Pipeline, isolated
from tests.integration import apicurio

pytestmark = pytest.mark.examples

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "contract"
PARTITIONS = 8  # the Go example takes AGENTSTREAM_PARTITIONS; the others read agent.outcomes' partition count
LANGUAGES = ("java", "go", "node", "python")


def _build(argv: list[str], cwd: Path, what: str, timeout: float = 900) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{what} failed ({' '.join(argv)}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _need(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH: the example cannot be built here")


def _build_java(_out: Path) -> list[str]:
    _need("mvn", "java")
    project = EXAMPLES / "java"
    _build(["mvn", "-q", "-B", "package"], project, "mvn package")
    return ["java", "-cp", f"{project}/target/classes:{project}/target/lib/*", "SubmitTask"]


def _build_go(out: Path) -> list[str]:
    _need("go")
    # go.mod asks for Go 1.26 (franz-go 1.22 does); Go 1.21+ fetches that toolchain itself, older ones cannot.
    version = subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.strip()
    found = re.match(r"go1\.(\d+)", version)
    if found is None or int(found.group(1)) < 21:
        pytest.skip(f"{version or 'go'} cannot build a module that needs Go 1.26 (Go 1.21+ can: it fetches it)")
    binary = out / "submit-go"
    _build(["go", "build", "-o", str(binary), "."], EXAMPLES / "go", "go build")
    return [str(binary)]


def _build_node(_out: Path) -> list[str]:
    _need("node", "npm")
    _build(["npm", "ci", "--no-audit", "--no-fund"], EXAMPLES / "node", "npm ci")
    return ["node", str(EXAMPLES / "node" / "submit.js")]


def _python_venv(out: Path) -> Path:
    """A virtual environment of the Python examples' own (their pinned requirements, not agentstream's)."""
    venv = out / "venv"
    if not (venv / "bin" / "python").exists():
        _build([sys.executable, "-m", "venv", str(venv)], out, "python -m venv")
        _build([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-r",
                str(EXAMPLES / "python" / "requirements.txt")], out, "pip install")
    return venv / "bin" / "python"


def _build_python(out: Path) -> list[str]:
    return [str(_python_venv(out)), str(EXAMPLES / "python" / "submit.py")]


BUILDERS: dict[str, Callable[[Path], list[str]]] = {
    "java": _build_java, "go": _build_go, "node": _build_node, "python": _build_python}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[str]]:
    """The command that runs each example, built once per module (a failed build fails its tests)."""
    out = tmp_path_factory.mktemp("examples")
    cache: dict[str, list[str]] = {}

    def get(language: str) -> list[str]:
        if language not in cache:
            cache[language] = BUILDERS[language](out)
        return cache[language]

    return get


def _env(bootstrap: str, prefix: str, **extra: str) -> dict[str, str]:
    """What the examples read: the broker, the deployment's topic prefix and partitions, the schemas."""
    return {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": bootstrap, "AGENTSTREAM_TOPIC_PREFIX": prefix,
            "AGENTSTREAM_PARTITIONS": str(PARTITIONS), "AGENTSTREAM_SCHEMAS_DIR": str(ROOT / "schemas"), **extra}


async def _run(argv: list[str], env: dict[str, str], *args: str) -> tuple[int, str, str]:
    """Run an example from the repository's root without blocking the pipeline's event loop."""
    proc = await asyncio.create_subprocess_exec(*argv, *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, stdout.decode(), stderr.decode()


def _submitted_run(stdout: str, stderr: str = "") -> str:
    found = re.search(r"^run (\S+) submitted to ", stdout, re.M)
    assert found, f"the example did not say which run it submitted:\n{stdout}\n{stderr}"
    return found.group(1)


@pytest.mark.parametrize("language", LANGUAGES)
async def test_an_example_completes_a_turn_of_a_session(language, built, settings):
    """The example's run completes with its structured output, on its session's partition."""
    argv = await asyncio.to_thread(built, language)
    s = isolated(settings, f"ex{uuid.uuid4().hex[:8]}.", partitions=PARTITIONS)
    session = f"{language}-{uuid.uuid4().hex[:8]}"
    async with Pipeline.start(s, WorkerOptions(backend="scripted")) as pipe:
        rc, stdout, stderr = await _run(argv, _env(s.kafka_bootstrap, s.topic_prefix, WAIT_S="120"), session)
        assert rc == 0, f"exit {rc}\n{stdout}\n{stderr}"
        run_id = _submitted_run(stdout, stderr)
        assert "RunCompleted" in stdout and "42" in stdout.split("RunCompleted", 1)[1], stdout
        # What the example printed is what the pipeline recorded: the run, its structured output, its session.
        result = await pipe.client.wait(run_id, timeout=30)
        assert result.ok and result.output == {"result": 42}, result
        events = await pipe.client.events(run_id)
        (task,) = [e for e in events if e["event_type"] == "TaskSubmitted"]
        assert task["payload"]["session"] == session
        assert task["partition"] == pipe.worker.runtime.topics.partition_for(session)


@pytest.mark.parametrize("language", LANGUAGES)
async def test_an_example_exits_non_zero_on_run_failed(language, built, settings):
    """A pipeline that serves no tools refuses the example's task (its `calculator` is not registered): the
    example must say RunFailed with the code and reason, and exit 1."""
    argv = await asyncio.to_thread(built, language)
    s = isolated(settings, f"exf{uuid.uuid4().hex[:8]}.", partitions=PARTITIONS)
    async with Pipeline.start(s, WorkerOptions(backend="scripted", tool_modules=())):
        rc, stdout, stderr = await _run(argv, _env(s.kafka_bootstrap, s.topic_prefix, WAIT_S="120"))
    _submitted_run(stdout, stderr)
    assert rc == 1, f"exit {rc}\n{stdout}\n{stderr}"
    assert "RunFailed invalid_task" in stderr and "calculator" in stderr, stderr
    assert "RunCompleted" not in stdout, stdout


@pytest.mark.parametrize("language", LANGUAGES)
async def test_an_example_gives_up_when_no_outcome_comes(language, built, kafka_bootstrap, topic_factory, unique):
    """No planner reads the topics: the example must stop at its timeout, non-zero, naming the run."""
    argv = await asyncio.to_thread(built, language)
    for name in ("agent.tasks", "agent.outcomes"):
        topic = await topic_factory(name, partitions=PARTITIONS)  # test.{unique}.{name}
        await _partitions_led(kafka_bootstrap, topic)
    rc, stdout, stderr = await _run(argv, _env(kafka_bootstrap, f"test.{unique}.", WAIT_S="3"), "nobody-listens")
    run_id = _submitted_run(stdout, stderr)
    assert rc == 2, f"exit {rc}\n{stdout}\n{stderr}"
    assert f"no outcome for {run_id}" in stderr, stderr


async def _partitions_led(bootstrap: str, topic: str) -> None:
    """Wait until every partition of a topic just created has a leader (its offsets can be listed): a client
    that asks sooner is refused, which is not what the test is about."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        await consumer.stop()


def _registry_id(url: str, subject: str) -> int:
    with urllib.request.urlopen(f"{url}/subjects/{subject}/versions/latest", timeout=10) as resp:
        return int(json.loads(resp.read())["id"])


async def _first_record_value(settings: Settings, topic: str, key: bytes) -> bytes:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for messages in (await consumer.getmany(timeout_ms=300)).values():
                for m in messages:
                    if m.key == key and m.value is not None:
                        return m.value
        raise AssertionError(f"no record keyed {key!r} on {topic}")
    finally:
        await consumer.stop()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory):
    """Apicurio Registry 3.x on free ports for this module (its schemas in memory); stopped afterwards."""
    try:
        apicurio.application()
        apicurio.java()
    except apicurio.Unavailable as exc:
        pytest.skip(str(exc))
    with apicurio.running(tmp_path_factory.mktemp("apicurio") / "apicurio.log") as url:
        yield url


#: The registry variants: the language whose build runs it, and its source.
REGISTRY_EXAMPLES = {"python": "python/submit_registry.py", "node": "node/submit_registry.js"}


@pytest.mark.parametrize("language", REGISTRY_EXAMPLES)
async def test_an_example_through_a_schema_registry(language, built, settings, registry):
    """The registry variant's run completes, its task framed with the registry's id (the Node one as a turn of
    a session, as its plain example; the Python one a run on its own)."""
    runner = (await asyncio.to_thread(built, language))[:-1]  # the example's interpreter, without its plain source
    s = replace(isolated(settings, f"exr{uuid.uuid4().hex[:8]}.", partitions=PARTITIONS), schema_registry_url=registry)
    session = f"{language}-{uuid.uuid4().hex[:8]}" if language == "node" else None
    async with Pipeline.start(s, WorkerOptions(backend="scripted")) as pipe:
        # The workers registered agentstream's schemas under their records' names (RecordNameStrategy).
        task_id = await asyncio.to_thread(_registry_id, registry, "io.agentstream.events.TaskSubmitted")
        rc, stdout, stderr = await _run([*runner, str(EXAMPLES / REGISTRY_EXAMPLES[language])],
                                        _env(s.kafka_bootstrap, s.topic_prefix, SCHEMA_REGISTRY_URL=registry, WAIT_S="120"),
                                        *([session] if session else []))
        assert rc == 0, f"exit {rc}\n{stdout}\n{stderr}"
        run_id = _submitted_run(stdout, stderr)
        assert "RunCompleted" in stdout and "result: 42" in stdout, stdout
        result = await pipe.client.wait(run_id, timeout=30)
        assert result.ok and result.output == {"result": 42}, result
        # The task went through the registry: framed with the registry's id, not the local (hash) one.
        value = await _first_record_value(s, pipe.worker.runtime.topics.tasks, run_id.encode())
        assert value[0] == 0 and int.from_bytes(value[1:5], "big") == task_id
        assert task_id != 1264757939  # TaskSubmitted's id without a registry (docs/contract.md)
        if session:
            (task,) = [e for e in await pipe.client.events(run_id) if e["event_type"] == "TaskSubmitted"]
            assert task["payload"]["session"] == session
            assert task["partition"] == pipe.worker.runtime.topics.partition_for(session)


@pytest.mark.parametrize("language", REGISTRY_EXAMPLES)
async def test_a_registry_example_exits_non_zero_on_run_failed(language, built, settings, registry):
    """The RunFailed the pipeline answers (no `calculator` served), decoded through the registry: exit 1."""
    runner = (await asyncio.to_thread(built, language))[:-1]
    s = replace(isolated(settings, f"exrf{uuid.uuid4().hex[:8]}.", partitions=PARTITIONS), schema_registry_url=registry)
    async with Pipeline.start(s, WorkerOptions(backend="scripted", tool_modules=())):
        rc, stdout, stderr = await _run([*runner, str(EXAMPLES / REGISTRY_EXAMPLES[language])],
                                        _env(s.kafka_bootstrap, s.topic_prefix, SCHEMA_REGISTRY_URL=registry, WAIT_S="120"))
    _submitted_run(stdout, stderr)
    assert rc == 1, f"exit {rc}\n{stdout}\n{stderr}"
    assert "RunFailed invalid_task" in stderr and "calculator" in stderr, stderr
    assert "RunCompleted" not in stdout, stdout


@pytest.mark.parametrize("language", REGISTRY_EXAMPLES)
async def test_a_registry_example_gives_up_when_no_outcome_comes(language, built, kafka_bootstrap, topic_factory,
                                                                 unique, registry):
    """No planner reads the topics (the schemas registered as a worker does): stop at the timeout, exit 2."""
    runner = (await asyncio.to_thread(built, language))[:-1]
    await asyncio.to_thread(HttpRegistry, registry)  # registers agentstream's current schemas, as workers do
    for name in ("agent.tasks", "agent.outcomes"):
        topic = await topic_factory(name, partitions=PARTITIONS)  # test.{unique}.{name}
        await _partitions_led(kafka_bootstrap, topic)
    rc, stdout, stderr = await _run([*runner, str(EXAMPLES / REGISTRY_EXAMPLES[language])],
                                    _env(kafka_bootstrap, f"test.{unique}.", SCHEMA_REGISTRY_URL=registry, WAIT_S="3"))
    run_id = _submitted_run(stdout, stderr)
    assert rc == 2, f"exit {rc}\n{stdout}\n{stderr}"
    assert f"no outcome for {run_id}" in stderr, stderr
