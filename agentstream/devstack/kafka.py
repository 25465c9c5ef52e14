"""A single-node Apache Kafka 4 broker (KRaft) run from jars that Maven resolves from Maven Central.

Steps, each idempotent:

1. ``ensure_jars``: ``mvn dependency:copy-dependencies`` on ``infra/kafka/pom.xml`` into
   ``<cache>/kafka-<version>/`` (skipped when that directory is complete);
2. ``start``: render ``infra/kafka/server.properties.in`` (plus the launcher's ``overrides``), format KRaft storage once with
   ``kafka.tools.StorageTool``, start ``kafka.Kafka`` detached, wait until a metadata request succeeds;
3. ``stop``: SIGTERM by PID, SIGKILL after a grace period.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import string
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agentstream.devstack import process
from agentstream.streams.errors import StackError

JVM_OPTS = [
    "-Xms256m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
]


def kafka_version(infra_dir: Path) -> str:
    """The Kafka version pinned in ``infra/kafka/pom.xml``."""
    pom = (infra_dir / "kafka" / "pom.xml").read_text()
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    if not match:
        raise StackError(f"no <kafka.version> in {infra_dir / 'kafka' / 'pom.xml'}")
    return match.group(1).strip()


def check_java() -> None:
    """Raise a clear error unless Java 17 or newer is on PATH."""
    java = shutil.which("java")
    if not java:
        raise StackError("Java 17+ is required to run Kafka and `java` is not on PATH "
                         "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):
        major = int(match.group(2))
    if major < 17:
        raise StackError(f"Kafka 4 needs Java 17 or newer; `java -version` says: {out.strip().splitlines()[0]}")


@dataclass(frozen=True, kw_only=True)
class KafkaLauncher:
    """``overrides``: broker properties appended to the rendered ``server.properties`` (the last value
    of a key wins), e.g. ``{"auto.create.topics.enable": "true"}`` to test against Kafka's defaults."""

    infra_dir: Path
    cache_dir: Path
    work_dir: Path
    port: int
    controller_port: int
    overrides: Mapping[str, str] = field(default_factory=dict, hash=False)

    @property
    def version(self) -> str:
        return kafka_version(self.infra_dir)

    @property
    def jars_dir(self) -> Path:
        return self.cache_dir / f"kafka-{self.version}"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "kafka.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ensure_jars(self) -> Path:
        """Resolve the broker's jars once; later calls reuse the cache directory."""
        done = self.jars_dir / ".complete"
        if done.exists():
            return self.jars_dir
        mvn = shutil.which("mvn")
        if not mvn:
            raise StackError(
                f"Maven is required once to fetch Kafka {self.version} from Maven Central and `mvn` is "
                "not on PATH (Debian/Ubuntu: apt-get install maven)"
            )
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"kafka-{self.version}.", dir=self.cache_dir))
        try:
            process.run(
                [mvn, "-q", "-B", "-f", str(self.infra_dir / "kafka" / "pom.xml"),
                 "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"],
                timeout=900,
            )
            if not any(tmp.glob("kafka_2.13-*.jar")):
                raise StackError(f"Maven finished but no kafka_2.13 jar is in {tmp}")
            (tmp / ".complete").write_text(self.version + "\n")
            shutil.rmtree(self.jars_dir, ignore_errors=True)
            tmp.rename(self.jars_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return self.jars_dir

    def _java(self, main: str, *args: str, jvm: list[str] | None = None) -> list[str]:
        log4j = self.infra_dir / "kafka" / "log4j2.properties"
        return ["java", *(jvm or []), "-cp", f"{self.jars_dir}/*",
                f"-Dlog4j2.configurationFile={log4j}", main, *args]

    def _render_config(self) -> Path:
        template = string.Template((self.infra_dir / "kafka" / "server.properties.in").read_text())
        config = self.work_dir / "server.properties"
        text = template.substitute(port=self.port, controller_port=self.controller_port, data_dir=self.data_dir)
        config.write_text(text + _overrides_block(self.overrides))
        return config

    def _format_storage(self, config: Path) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = process.run(self._java("kafka.tools.StorageTool", "random-uuid")).stdout.split()[-1]
        process.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config),
                               "--ignore-formatted"))

    def preflight(self) -> None:
        """Fail before anything starts: Java 17+, free ports, Maven when the jars are not cached."""
        check_java()
        for port in (self.port, self.controller_port):
            if process.port_in_use("127.0.0.1", port):
                raise StackError(
                    f"port {port} on 127.0.0.1 is taken, so Kafka cannot listen there; stop what holds it "
                    "or choose other ports (agentstream dev up --kafka-port N; the controller uses N+1)"
                )
        if not (self.jars_dir / ".complete").exists() and not shutil.which("mvn"):
            raise StackError(
                f"Maven is required once to fetch Kafka {self.version} from Maven Central and `mvn` is "
                "not on PATH (Debian/Ubuntu: apt-get install maven)"
            )

    def start(self, *, timeout: float = 60.0) -> process.ProcessRef:
        """Start the broker; return it once it answers a metadata request."""
        self.preflight()
        self.ensure_jars()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self._render_config()
        self._format_storage(config)
        proc = process.spawn_detached(self._java("kafka.Kafka", str(config), jvm=JVM_OPTS),
                                      log_file=self.log_file)
        ref = process.ProcessRef.of(proc.pid)
        try:
            if ref is None:
                raise StackError(f"Kafka exited at once:\n{process.log_tail(self.log_file)}")
            asyncio.run(wait_for_metadata(self.bootstrap, within=timeout, proc=proc, log_file=self.log_file))
        except BaseException:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        return ref

    @staticmethod
    def stop(ref: process.ProcessRef | None) -> bool:
        """SIGTERM lets the broker shut down cleanly (it deregisters, so the next start is quick)."""
        return process.stop(ref, grace=60)


def _overrides_block(overrides: Mapping[str, str]) -> str:
    """The lines appended to ``server.properties``; a newline in a key or value would smuggle in
    another property, so it is refused."""
    if not overrides:
        return ""
    lines = ["", "# Overrides passed to KafkaLauncher (the last value of a key wins)."]
    for key, value in overrides.items():
        if any(c in f"{key}{value}" for c in "\r\n") or not key.strip():
            raise StackError(f"invalid broker property override {key!r}={value!r}")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


async def metadata_ok(bootstrap: str, *, request_timeout_ms: int = 2000) -> bool:
    """True when the cluster answers a metadata request and lists at least one broker."""
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
    try:
        await client.bootstrap()
        return bool(client.cluster.brokers())
    except Exception:
        return False
    finally:
        await client.close()


async def wait_for_metadata(bootstrap: str, *, within: float, proc: subprocess.Popen | None = None,
                            log_file: Path | None = None) -> None:
    """Poll until the broker answers; fail early with its log when the process died."""
    quiet = logging.getLogger("aiokafka")  # "Unable connect" on every poll before the port opens
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        await _poll_metadata(bootstrap, within=within, proc=proc, log_file=log_file)
    finally:
        quiet.setLevel(level)


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else -1
    except OSError:
        return -1


async def _poll_metadata(bootstrap: str, *, within: float, proc: subprocess.Popen | None,
                         log_file: Path | None) -> None:
    # A broker with thousands of partitions on disk spends minutes loading them before it listens; while
    # its log keeps growing it is making progress, so the deadline moves (up to a hard cap).
    start = time.monotonic()
    deadline, cap = start + within, start + max(within, 600.0)
    last_size = -1
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = process.log_tail(log_file) if log_file else ""
            raise StackError(f"Kafka exited during start-up:\n{tail}")
        if await metadata_ok(bootstrap):
            return
        size = _size(log_file)
        if size != last_size and last_size >= 0:
            deadline = min(cap, max(deadline, time.monotonic() + 15.0))
        last_size = size
        await asyncio.sleep(0.2)
    raise StackError(f"Kafka at {bootstrap} did not answer a metadata request within {within:.0f} s")
