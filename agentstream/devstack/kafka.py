"""A single-node Apache Kafka 4 broker (KRaft) run from jars that Maven resolves from Maven Central.

Steps, each idempotent:

1. ``ensure_jars``: ``mvn dependency:copy-dependencies`` on ``infra/kafka/pom.xml`` into
   ``<cache>/kafka-<version>/`` (skipped when that directory is complete);
2. ``start``: render ``infra/kafka/server.properties.in`` (plus the launcher's ``overrides``), format KRaft storage once with
   ``kafka.tools.StorageTool``, start ``kafka.Kafka`` detached, wait until a metadata request succeeds;
3. ``stop``: SIGTERM by PID, SIGKILL after a grace period.

A node's work directory (configuration, log, data) is its owner's only: 0700 directories, 0600 files
(fixed at every start) and the broker and the storage tool run with umask 077, so a log segment, which
holds the tasks' text, is not readable by another account (issue 37). On a secure node the SCRAM
credentials (salted passwords, which log in as well as the passwords) reach the storage tool through a
0600 argument file, never its command line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import string
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentstream.devstack import files, process
from agentstream.devstack.secure import StackSecrets
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.config.masking import mask_url
from agentstream.streams.core.errors import StackError

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
    """One KRaft node (broker and controller in one process). ``overrides``: broker properties appended
    to the rendered ``server.properties`` (the last value of a key wins), e.g.
    ``{"auto.create.topics.enable": "true"}`` to test against Kafka's defaults. A node of a cluster
    (``KafkaCluster``) has its ``node_id``, the cluster's ``voters`` and its ``replication``."""

    infra_dir: Path
    cache_dir: Path
    work_dir: Path
    port: int
    controller_port: int
    overrides: Mapping[str, str] = field(default_factory=dict, hash=False)
    node_id: int = 1
    #: The address it listens on and advertises (a test host's, bench/netsim/regions.py; default loopback).
    host: str = "127.0.0.1"
    #: ``controller.quorum.voters`` (default: this node alone).
    voters: str = ""
    #: Replicas of every topic, internal ones included; writes need ``replication - 1`` of them in sync.
    replication: int = 1
    #: SASL/SCRAM and ACLs (``agentstream dev up --secure``): the principals' passwords; None is PLAINTEXT.
    secrets: StackSecrets | None = field(default=None, hash=False)

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
        return f"{self.host}:{self.port}"

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

    @property
    def admin_auth(self) -> KafkaAuth:
        """How the launcher itself connects (the super user on a secure node)."""
        return self.secrets.admin if self.secrets else KafkaAuth()

    def _render_config(self) -> Path:
        template = string.Template((self.infra_dir / "kafka" / "server.properties.in").read_text())
        config = self.work_dir / "server.properties"
        text = template.substitute(port=self.port, controller_port=self.controller_port, data_dir=self.data_dir,
                                   node_id=self.node_id, host=self.host,
                                   voters=self.voters or f"{self.node_id}@{self.host}:{self.controller_port}",
                                   replication=self.replication, min_isr=max(1, self.replication - 1),
                                   listener="SASL_PLAINTEXT" if self.secrets else "PLAINTEXT")
        if self.secrets:
            text += self.secrets.broker_properties(self.infra_dir / "kafka" / "server-secure.properties.in")
        config.unlink(missing_ok=True)  # created 0600: a secure node's holds the super user's password
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text + _overrides_block(self.overrides))
        return config

    def new_cluster_id(self) -> str:
        return process.run(self._java("kafka.tools.StorageTool", "random-uuid")).stdout.split()[-1]

    def _format_storage(self, config: Path, cluster_id: str | None = None) -> None:
        """Format the storage once. The arguments (with the SCRAM credentials on a secure node) are in an
        argument file: ``/proc/PID/cmdline``, which every account may read, shows ``java @FILE`` only."""
        if (self.data_dir / "meta.properties").exists():
            return
        scram = self.secrets.scram_arguments() if self.secrets else []
        argv = self._java("kafka.tools.StorageTool", "format", "-t", cluster_id or self.new_cluster_id(),
                          "-c", str(config), "--ignore-formatted", *scram)
        with files.java_argfile(self.work_dir, "format.args", argv[1:]) as argfile:
            process.run([argv[0], argfile], umask=files.PRIVATE_UMASK)

    def preflight(self) -> None:
        """Fail before anything starts: Java 17+, free ports, Maven when the jars are not cached."""
        check_java()
        for port in (self.port, self.controller_port):
            if process.port_in_use(self.host, port):
                raise StackError(
                    f"port {port} on {self.host} is taken, so Kafka cannot listen there; stop what holds it "
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
        proc, ref = self.spawn()
        try:
            asyncio.run(wait_for_metadata(self.bootstrap, within=timeout, proc=proc, log_file=self.log_file,
                                          auth=self.admin_auth))
        except BaseException:
            _terminate(proc)
            raise
        return ref

    def spawn(self, cluster_id: str | None = None) -> tuple[subprocess.Popen, process.ProcessRef]:
        """Render, format (once, with ``cluster_id`` when it joins a cluster) and start the node, without
        waiting for it: a cluster's nodes answer only once a majority of its controllers runs. Its work
        directory is made private first (an older version's data was world-readable)."""
        files.private_dir(self.work_dir)
        files.restrict_tree(self.work_dir)
        config = self._render_config()
        self._format_storage(config, cluster_id)
        proc = process.spawn_detached(self._java("kafka.Kafka", str(config), jvm=JVM_OPTS),
                                      log_file=self.log_file)
        ref = process.ProcessRef.of(proc.pid)
        if ref is None:
            raise StackError(f"Kafka exited at once:\n{process.log_tail(self.log_file)}")
        return proc, ref

    @staticmethod
    def stop(ref: process.ProcessRef | None) -> bool:
        """SIGTERM lets the broker shut down cleanly (it deregisters, so the next start is quick)."""
        return process.stop(ref, grace=60)


@dataclass(frozen=True)
class KafkaCluster:
    """``size`` KRaft nodes on 127.0.0.1 (or ``host``), each broker and controller, all three voters of
    the metadata quorum (so it survives one node down). Node ``n`` (1-based) listens on
    ``port + 2(n-1)`` and its controller on the port after; its data is in ``work_dir`` (node 1) or
    ``work_dir-n``. Every topic gets ``min(size, 3)`` replicas and writes need all but one of them
    (``min.insync.replicas``)."""

    infra_dir: Path
    cache_dir: Path
    work_dir: Path
    port: int
    size: int = 3
    #: Broker properties for every node (``KafkaLauncher.overrides``).
    overrides: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: The address every node listens on (``KafkaLauncher.host``).
    host: str = "127.0.0.1"
    #: SASL/SCRAM and ACLs on every node (``KafkaLauncher.secrets``).
    secrets: StackSecrets | None = field(default=None, hash=False)

    @property
    def nodes(self) -> list[KafkaLauncher]:
        voters = ",".join(f"{n}@{self.host}:{self._port(n) + 1}" for n in range(1, self.size + 1))
        return [KafkaLauncher(infra_dir=self.infra_dir, cache_dir=self.cache_dir,
                              work_dir=self.work_dir if n == 1 else self.work_dir.with_name(f"{self.work_dir.name}-{n}"),
                              port=self._port(n), controller_port=self._port(n) + 1, node_id=n,
                              voters=voters if self.size > 1 else "", replication=min(self.size, 3),
                              overrides=self.overrides, host=self.host, secrets=self.secrets)
                for n in range(1, self.size + 1)]

    def _port(self, node: int) -> int:
        return self.port + 2 * (node - 1)

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def preflight(self) -> None:
        for node in self.nodes:
            node.preflight()

    def start(self, only: set[int] | None = None, *, timeout: float = 90.0) -> dict[int, process.ProcessRef]:
        """Start the nodes (``only`` these node ids: the others run already); return them by node id once
        the cluster answers with every node registered."""
        nodes = [n for n in self.nodes if only is None or n.node_id in only]
        if not nodes:
            return {}
        first = nodes[0]
        first.ensure_jars()
        cluster_id = None
        if not any((n.data_dir / "meta.properties").exists() for n in self.nodes):
            cluster_id = first.new_cluster_id()
        elif any(not (n.data_dir / "meta.properties").exists() for n in nodes):
            cluster_id = _cluster_id(self.nodes)
        started: list[tuple[KafkaLauncher, subprocess.Popen, process.ProcessRef]] = []
        try:
            for node in nodes:
                proc, ref = node.spawn(cluster_id)
                started.append((node, proc, ref))
            asyncio.run(wait_for_brokers(self.bootstrap, self.size, within=timeout,
                                         procs=[(p, n.log_file) for n, p, _ in started], auth=first.admin_auth))
        except BaseException:
            for _, proc, _ in started:
                _terminate(proc)
            raise
        return {node.node_id: ref for node, _, ref in started}


def node_refs(state: Mapping[str, Any]) -> dict[int, process.ProcessRef | None]:
    """The local Kafka nodes' processes by node id, from a stack's state file (``agentstream dev up``'s
    format: node 1 under ``kafka_pid``/``kafka_started``, the others under ``kafka_nodes``)."""
    refs = {1: process.ProcessRef.from_state(state.get("kafka_pid"), state.get("kafka_started"))}
    nodes = state.get("kafka_nodes") or {}
    for n in range(2, int(state.get("kafka_brokers") or 1) + 1):
        node = nodes.get(str(n)) or {}
        refs[n] = process.ProcessRef.from_state(node.get("pid"), node.get("started"))
    return refs


def node_state(state: Mapping[str, Any], started: Mapping[int, process.ProcessRef]) -> dict[str, Any]:
    """The state-file keys that record the nodes just ``started`` (the others keep their entries)."""
    changes: dict[str, Any] = {}
    nodes = dict(state.get("kafka_nodes") or {})
    for node_id, ref in started.items():
        if node_id == 1:
            changes.update(kafka_pid=ref.pid, kafka_started=ref.started)
        else:
            nodes[str(node_id)] = {"pid": ref.pid, "started": ref.started}
    if nodes:
        changes["kafka_nodes"] = nodes
    return changes


def _cluster_id(nodes: list[KafkaLauncher]) -> str | None:
    """The cluster id the formatted nodes share (to format one whose data was removed)."""
    for node in nodes:
        meta = node.data_dir / "meta.properties"
        if meta.exists():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.partition("=")[2].strip()
    return None


def _terminate(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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


async def brokers_registered(bootstrap: str, *, request_timeout_ms: int = 2000, auth: KafkaAuth) -> int:
    """How many brokers the cluster's metadata lists (0 when it does not answer)."""
    from aiokafka.client import AIOKafkaClient

    client = AIOKafkaClient(**kafka_options(bootstrap, auth), request_timeout_ms=request_timeout_ms)
    try:
        await client.bootstrap()
        return len(client.cluster.brokers())
    except Exception:
        return 0
    finally:
        await client.close()


async def metadata_ok(bootstrap: str, *, request_timeout_ms: int = 2000, auth: KafkaAuth) -> bool:
    """True when the cluster answers a metadata request and lists at least one broker."""
    return await brokers_registered(bootstrap, request_timeout_ms=request_timeout_ms, auth=auth) > 0


async def wait_for_metadata(bootstrap: str, *, within: float, proc: subprocess.Popen | None = None,
                            log_file: Path | None = None, auth: KafkaAuth) -> None:
    """Poll until the broker answers; fail early with its log when the process died."""
    await wait_for_brokers(bootstrap, 1, within=within, procs=[(proc, log_file)] if proc is not None else [],
                           auth=auth)


async def wait_for_brokers(bootstrap: str, count: int, *, within: float,
                           procs: list[tuple[subprocess.Popen, Path | None]], auth: KafkaAuth) -> None:
    """Until the metadata lists ``count`` brokers; fail early with a node's log when it died."""
    quiet = logging.getLogger("aiokafka")  # "Unable connect" on every poll before the port opens
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        await _poll_metadata(bootstrap, count, within=within, procs=procs, auth=auth)
    finally:
        quiet.setLevel(level)


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else -1
    except OSError:
        return -1


async def _poll_metadata(bootstrap: str, count: int, *, within: float,
                         procs: list[tuple[subprocess.Popen, Path | None]], auth: KafkaAuth) -> None:
    # A broker with thousands of partitions on disk spends minutes loading them before it listens; while
    # its log keeps growing it is making progress, so the deadline moves (up to a hard cap).
    start = time.monotonic()
    deadline, cap = start + within, start + max(within, 600.0)
    last_size = -1
    while time.monotonic() < deadline:
        for proc, log_file in procs:
            if proc.poll() is not None:
                tail = process.log_tail(log_file) if log_file else ""
                raise StackError(f"Kafka exited during start-up:\n{tail}")
        if await brokers_registered(bootstrap, auth=auth) >= count:
            return
        size = sum(_size(log_file) for _, log_file in procs)
        if size != last_size and last_size >= 0:
            deadline = min(cap, max(deadline, time.monotonic() + 15.0))
        last_size = size
        await asyncio.sleep(0.2)
    what = "answer a metadata request" if count == 1 else f"list {count} brokers"
    raise StackError(f"Kafka at {mask_url(bootstrap)} did not {what} within {within:.0f} s")
