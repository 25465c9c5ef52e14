"""Another account on the dev stack's machine (issue 37, findings 5-7), against the real secure stack with two
tenants: it cannot reach PostgreSQL's Unix socket (where ``trust`` applies), nor read PostgreSQL's data, a
Kafka log segment holding a tenant's task or the state directory; no salted SCRAM password is on any
process's command line while the broker's storage is formatted; and a private stack's data, PostgreSQL's
included, is gone after ``close()``.

"Another account" is ``nobody``: the server runs as the stack's own account (``agentstream`` as root,
else the current user). Switching to it needs root; the probes are skipped otherwise, the modes they rest
on are checked for every user.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from agentstream.devstack import files
from agentstream.devstack.kafka import KafkaLauncher
from agentstream.devstack.postgres import SUPERUSER
from agentstream.devstack.private import PrivateStack
from agentstream.streams.kafka.topics import Topics
from tests.integration.hostile.conftest import ACME

pytestmark = pytest.mark.asyncio(loop_scope="package")

ROOT = os.geteuid() == 0
OTHER = "nobody"
#: The probe runs on the system's Python: the test's own may sit under a home only its owner can enter.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
PROBE = """
import errno, json, os, socket, sys
results = {}
for name, (kind, path) in json.loads(sys.argv[1]).items():
    try:
        if kind == "list":
            os.listdir(path)
        elif kind == "read":
            with open(path, "rb") as f:
                f.read(1)
        else:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
        results[name] = "ok"
    except OSError as exc:
        results[name] = errno.errorcode.get(exc.errno, str(exc))
print(json.dumps(results))
"""


def _cannot_switch() -> str | None:
    if not ROOT:
        return "probing as another account needs root (to switch to it)"
    if SYSTEM_PYTHON is None:
        return "no /usr/bin/python3 for the other account to run"
    if os.environ.get("AGENTSTREAM_PG_USER") == OTHER:
        return f"AGENTSTREAM_PG_USER={OTHER}: the server's own account is not another one"
    return None


def as_other_account(checks: dict[str, tuple[str, Path]]) -> dict[str, str]:
    """Each check (``list`` a directory, ``read`` a file, ``connect`` to a Unix socket) tried as ``nobody``:
    ``"ok"`` or the error's name."""
    entry = pwd.getpwnam(OTHER)
    done = subprocess.run([str(SYSTEM_PYTHON), "-c", PROBE, json.dumps({k: (kind, str(p)) for k, (kind, p) in checks.items()})],
                          capture_output=True, text=True, timeout=30, cwd="/", user=entry.pw_uid, group=entry.pw_gid,
                          extra_groups=[])
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _entries(root: Path) -> Iterator[tuple[Path, int]]:
    """``root`` and everything under it with its mode (entries a running server removes meanwhile skipped)."""
    for path in [root, *root.rglob("*")]:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISLNK(info.st_mode):
            yield path, stat.S_IMODE(info.st_mode)


def _open_to_others(*roots: Path) -> list[str]:
    return [f"{oct(mode)} {path}" for root in roots for path, mode in _entries(root) if mode & 0o077]


def _socket(stack: PrivateStack) -> Path:
    return stack.postgres.work_dir / f".s.PGSQL.{stack.postgres.port}"


def _segment_with(data_dir: Path, topic_prefix: str, needle: bytes) -> Path:
    for segment in sorted(data_dir.glob(f"{topic_prefix}*/*.log")):
        if needle in segment.read_bytes():
            return segment
    raise AssertionError(f"no segment of {topic_prefix}* in {data_dir} holds {needle!r}")


async def test_the_secure_stacks_files_are_its_owners_only(cells):
    """Finding 7: a tenant's task text is in a log segment; it, and everything else of the stack, is 0600 in
    0700 directories. PostgreSQL's data runs as an account of the stack's own, not the shared ``nobody``."""
    stack = cells.stack
    marker = f"a secret of acme's {uuid.uuid4().hex}"
    async with cells.client(ACME) as client:
        run_id = await client.submit(f"[[answer:ok]] {marker}", tools=[], max_steps=2, prefetch=False)
        assert (await client.wait(run_id, timeout=60)).ok
    segment = _segment_with(stack.kafka.data_dir, f"{ACME}.agent.tasks-", marker.encode())
    assert stat.S_IMODE(segment.stat().st_mode) == 0o600
    assert _open_to_others(stack.paths.state_dir, stack.postgres.work_dir) == []
    assert stat.S_IMODE(stack.paths.state_dir.stat().st_mode) == 0o700
    socket_dir = stack.postgres.work_dir.stat()
    assert stat.S_IMODE(socket_dir.st_mode) == 0o700 and stat.S_IMODE(os.lstat(_socket(stack)).st_mode) == 0o700
    account = stack.postgres.run_as
    assert socket_dir.st_uid == (account.uid if account else os.geteuid())
    if account is not None and "AGENTSTREAM_PG_USER" not in os.environ:
        assert account.user == "agentstream"
        assert stack.postgres.work_dir.parent == Path("/var/lib/agentstream-postgres")


@pytest.mark.skipif(_cannot_switch() is not None, reason=_cannot_switch() or "")
async def test_another_account_cannot_reach_the_database_socket_or_read_the_data(cells):
    """Finding 5: the socket is trusted (``local all all trust``: root's own tools connect through it as
    ``postgres``), so it is the directory that keeps everyone else out."""
    stack = cells.stack
    conn = await asyncpg.connect(host=str(stack.postgres.work_dir), port=stack.postgres.port, user=SUPERUSER,
                                 database=stack.postgres.database)
    try:  # root, over the socket, as the superuser, without a password: what trust means
        assert await conn.fetchval("SELECT current_user") == SUPERUSER
    finally:
        await conn.close()
    segment = next(p for p in sorted(stack.kafka.data_dir.glob(f"{ACME}.agent.tasks-*/*.log")) if p.stat().st_size)
    results = as_other_account({
        "socket": ("connect", _socket(stack)),
        "postgres data": ("list", stack.postgres.data_dir),
        "postgres work dir": ("list", stack.postgres.work_dir),
        "kafka segment": ("read", segment),
        "state dir": ("list", stack.paths.state_dir),
        "secrets": ("list", stack.paths.state_dir / "secrets"),
    })
    assert results == dict.fromkeys(results, "EACCES")


async def test_formatting_a_secure_broker_puts_no_salted_password_on_any_command_line(cells, tmp_path):
    """Finding 6: the salted passwords log in as well as the passwords, and every account may read
    ``/proc/*/cmdline``. Formatting a node with the stack's credentials, every process's command line is read
    while it runs: the storage tool shows up (the scan sees it) with its argument file only. (Only the lines
    naming this node's directory count: other sessions on the machine format stacks of their own.)"""
    secrets = cells.stack.secrets
    assert secrets is not None
    launcher = KafkaLauncher(infra_dir=cells.stack.paths.infra_dir, cache_dir=cells.stack.paths.cache_dir,
                             work_dir=files.private_dir(tmp_path / "kafka"), port=1234, controller_port=1235,
                             secrets=secrets)
    seen: set[str] = set()
    done = threading.Event()

    def scan() -> None:
        while not done.is_set():
            for entry in Path("/proc").iterdir():
                try:
                    line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "StorageTool" in line or "format.args" in line or "scram" in line.lower():
                    seen.add(line)

    scanner = threading.Thread(target=scan, daemon=True)
    scanner.start()
    try:
        await asyncio.to_thread(launcher._format_storage, launcher._render_config(), "q1Sh-9_ISia_zwGINzRvyQ")
    finally:
        done.set()
        scanner.join(10)
    ours = [line for line in seen if str(launcher.work_dir) in line]  # not another session's stack's
    assert ours, seen  # the scan saw the storage tool run
    passwords = [secrets.password(name) for name in secrets.kafka_principals]
    for line in ours:
        assert "saltedpassword" not in line and "--add-scram" not in line, line
        assert not any(password in line for password in passwords), line
    assert any(f"@{launcher.work_dir / 'format.args'}" in line for line in ours), ours
    assert not (launcher.work_dir / "format.args").exists()
    bootstrap = (launcher.data_dir / "bootstrap.checkpoint").read_bytes()
    assert b"tenant-acme" in bootstrap and b"planner" in bootstrap  # the credentials did reach the broker
    assert _open_to_others(launcher.work_dir) == []


def _open_directory(tmp_path: Path) -> Path:
    """A directory every account may enter and list (as root under /var/tmp: pytest's own are 0700), with a
    ``state`` directory in it made as carelessly (0755)."""
    parent = Path(tempfile.mkdtemp(prefix="agentstream-local-users-", dir="/var/tmp" if ROOT else tmp_path))
    parent.chmod(0o755)
    (parent / "state").mkdir(mode=0o755)
    (parent / "state").chmod(0o755)  # whatever the umask
    return parent


async def test_a_private_stack_is_closed_to_others_and_its_data_goes_with_it(tmp_path):
    """Findings 5 and 7 on a stack made in a directory others may enter (as a careless caller would), and
    the leftovers of finding 5: after ``close()`` neither Kafka's nor PostgreSQL's data is left (as root the
    latter is outside the state directory, where nothing else would remove it)."""
    parent = _open_directory(tmp_path)
    try:
        state = parent / "state"
        stack = PrivateStack(state)
        try:
            await stack.start()
            topics = Topics("lu.", partitions=1)
            await stack.grant(topics)
            producer = AIOKafkaProducer(bootstrap_servers=stack.bootstrap, acks="all")
            await producer.start()
            try:
                await producer.send_and_wait(topics.tasks, b"a tenant's task text", key=b"run-1")
            finally:
                await producer.stop()
            segment = _segment_with(stack.kafka.data_dir, topics.tasks, b"a tenant's task text")
            assert _open_to_others(state, stack.postgres.work_dir) == []
            if _cannot_switch() is None:
                results = as_other_account({"state dir": ("list", state), "kafka segment": ("read", segment),
                                            "kafka data": ("list", stack.kafka.data_dir),
                                            "socket": ("connect", _socket(stack)),
                                            "postgres data": ("list", stack.postgres.data_dir)})
                assert results == dict.fromkeys(results, "EACCES")
        finally:
            await stack.close()
        assert not stack.kafka.work_dir.exists()
        assert not stack.postgres.work_dir.exists()
    finally:
        shutil.rmtree(parent, ignore_errors=True)
