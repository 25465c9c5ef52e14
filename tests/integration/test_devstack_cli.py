"""`agentstream dev up | down | status` on an isolated stack (own state directory and ports)."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from agentstream.devstack.postgres import default_work_dir
from agentstream.devstack.process import ProcessRef, RunAs, free_port, port_in_use
from agentstream.streams.config.masking import mask_url

pytestmark = pytest.mark.slow
CLI = [sys.executable, "-m", "agentstream.cli"]


def _env(state_dir: Path, kafka_port: int, pg_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL")}
    env.update(AGENTSTREAM_STATE_DIR=str(state_dir), AGENTSTREAM_KAFKA_PORT=str(kafka_port),
               AGENTSTREAM_PG_PORT=str(pg_port), **extra)
    return env


def _cli(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _processes_mentioning(needle: str) -> list[int]:
    """Live (non-zombie) processes whose command line mentions ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ref = ProcessRef.of(int(entry.name))
        if needle in cmd and ref is not None and ref.alive():
            found.append(ref.pid)
    return found


def _kafka_free_ports() -> int:
    """A broker port whose successor (the controller port) is free too."""
    for _ in range(50):
        port = free_port()
        if port < 65535 and not port_in_use("127.0.0.1", port + 1):
            return port
    raise RuntimeError("no free pair of ports")


def test_up_twice_then_down_leaves_no_process(tmp_path):
    state_dir = tmp_path / "state"
    env = _env(state_dir, _kafka_free_ports(), free_port())
    try:
        first = _cli(env, "dev", "up")
        assert first.returncode == 0, first.stdout + first.stderr
        state = json.loads((state_dir / "stack.json").read_text())
        assert stat.S_IMODE((state_dir / "stack.json").stat().st_mode) == 0o600  # it holds DATABASE_URL
        # Issue 37: the state, Kafka's data and PostgreSQL's (with its socket) are the owner's only.
        for directory in (state_dir, Path(state["kafka_dir"]), Path(state["postgres_dir"])):
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
        assert stat.S_IMODE((Path(state["kafka_dir"]) / "kafka.log").stat().st_mode) == 0o600
        status = json.loads(_cli(env, "dev", "status", "--json").stdout)
        # Printed URLs are masked (mask_url); the dev stack's has no password, so nothing changes here.
        assert status == {"kafka": state["kafka"], "database_url": mask_url(state["database_url"]), "running": True,
                          "secure": False, "brokers": [{"node_id": 1, "address": state["kafka"], "running": True,
                                       "pid": state["kafka_pid"]}]}

        second = _cli(env, "dev", "up")
        assert second.returncode == 0, second.stdout + second.stderr
        again = json.loads((state_dir / "stack.json").read_text())
        assert (again["kafka_pid"], again["postgres_pid"]) == (state["kafka_pid"], state["postgres_pid"])

        down = _cli(env, "dev", "down")
        assert down.returncode == 0, down.stdout + down.stderr
        for name in ("kafka", "postgres"):
            assert not ProcessRef(state[f"{name}_pid"], state[f"{name}_started"]).alive(), name
        assert not port_in_use("127.0.0.1", state["kafka_port"])
        assert not port_in_use("127.0.0.1", state["postgres_port"])
        assert _processes_mentioning(str(state_dir)) == []
        assert _processes_mentioning(state["postgres_dir"]) == []
        stopped = _cli(env, "dev", "status", "--json")
        assert stopped.returncode == 1 and json.loads(stopped.stdout)["running"] is False
    finally:
        _cli(env, "dev", "down", "--purge")


def test_a_secure_stack_starts_checks_and_switches_back_only_after_a_purge(tmp_path):
    """`dev up --secure`: Kafka and PostgreSQL authenticate, the CLI's commands find their own
    credentials (dev check as the administrator), nothing prints a password, and the stack cannot be
    restarted without authentication on its data."""
    state_dir = tmp_path / "state"
    env = _env(state_dir, _kafka_free_ports(), free_port())
    try:
        up = _cli(env, "dev", "up", "--secure", "--tenant", "acme")
        assert up.returncode == 0, up.stdout + up.stderr
        state = json.loads((state_dir / "stack.json").read_text())
        assert (state["kafka_security"], state["approvals"], state["tenants"]) == ("SASL_PLAINTEXT", "recorded",
                                                                                   ["acme"])
        secrets = sorted(p.name for p in (state_dir / "secrets").iterdir())
        assert {"planner.password", "db-approver.password", "tenant-acme.password", "db-tenant-acme.password",
                "db-approver-acme.password"} <= set(secrets)
        passwords = [(state_dir / "secrets" / name).read_text().strip() for name in secrets]
        status = _cli(env, "dev", "status", "--json")
        check = _cli(env, "dev", "check")
        assert check.returncode == 0, check.stdout + check.stderr
        assert json.loads(status.stdout)["secure"] is True
        assert json.loads(status.stdout)["database_url"].startswith("postgresql://client:***@")
        tenant_status = _cli({**env, "AGENTSTREAM_TENANT": "acme"}, "dev", "status", "--json")
        assert json.loads(tenant_status.stdout)["database_url"].startswith("postgresql://tenant-acme:***@")
        other = _cli(env, "dev", "up", "--tenant", "other")
        assert other.returncode != 0 and "--purge" in other.stderr, other.stdout + other.stderr
        plain = _cli(env, "dev", "up", "--insecure")
        assert plain.returncode != 0 and "--purge" in plain.stderr, plain.stdout + plain.stderr
        for out in (up, status, check, plain):
            assert not any(password in out.stdout + out.stderr for password in passwords)
    finally:
        _cli(env, "dev", "down", "--purge")
    assert not (state_dir / "secrets").exists()
    assert not Path(state["kafka_dir"]).exists() and not Path(state["postgres_dir"]).exists()  # outside it as root


def test_taken_port_is_a_clear_error_and_nothing_is_left_running(tmp_path):
    state_dir = tmp_path / "state"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        env = _env(state_dir, taken, free_port())
        try:
            result = _cli(env, "dev", "up")
            assert result.returncode == 2
            assert f"port {taken}" in result.stderr and "taken" in result.stderr, result.stderr
            assert _processes_mentioning(str(state_dir)) == []
            assert _processes_mentioning(str(_postgres_dir(state_dir))) == []
        finally:
            _cli(env, "dev", "down", "--purge")


def test_missing_java_is_a_clear_error(tmp_path):
    state_dir = tmp_path / "state"
    env = _env(state_dir, _kafka_free_ports(), free_port(), PATH="/nonexistent")
    try:
        result = _cli(env, "dev", "up")
        assert result.returncode == 2
        assert "Java 17+" in result.stderr, result.stderr
        assert _processes_mentioning(str(_postgres_dir(state_dir))) == []
    finally:
        _cli(env, "dev", "down", "--purge")


def _postgres_dir(state_dir: Path) -> Path:
    return default_work_dir(state_dir.resolve(), RunAs.for_postgres())


def test_a_password_in_database_url_is_used_but_never_printed(database_url, kafka_bootstrap, tmp_path):
    """The session's servers named by the environment, the URL with a password: ``dev status`` and
    ``dev check`` connect with it (the local stack trusts loopback, so any password does) and print it
    masked."""
    parts = urlsplit(database_url)
    if parts.password is not None:
        pytest.skip("this server checks passwords: the test cannot choose one")
    secret = f"n0t-Pr1nted-{uuid.uuid4().hex[:6]}"
    url = urlunsplit(parts._replace(netloc=f"{parts.username}:{secret}@{parts.hostname}:{parts.port}"))
    env = {**os.environ, "DATABASE_URL": url, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
           "AGENTSTREAM_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "300"}
    status = _cli(env, "dev", "status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr  # it connected: running
    assert json.loads(status.stdout)["database_url"] == mask_url(url) != url
    table = _cli(env, "dev", "status")
    check = _cli(env, "dev", "check")
    assert check.returncode == 0, check.stdout + check.stderr  # a vector round trip with the real URL
    for done in (status, table, check):
        assert secret not in done.stdout + done.stderr
    assert mask_url(url) in table.stdout
