"""Process and port helpers shared by the Kafka and PostgreSQL launchers.

Servers are started detached (their own session) so they outlive the ``agentstream dev up`` command,
and are stopped by PID only: SIGTERM, a grace period, then SIGKILL. A PID is signalled only after
checking that its start time is still the one recorded, so a recycled PID is never killed.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentstream.devstack.files import PRIVATE_UMASK, open_private_log
from agentstream.streams.core.errors import StackError


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on (or holds) ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def can_connect(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel says is free now (tests use it for isolated stacks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class ProcessRef:
    """A process we started, told apart from a later process that reuses its PID by its start time
    (clock ticks after boot, field 22 of ``/proc/PID/stat``)."""

    pid: int
    started: int

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        started = _start_ticks(pid)
        return None if started is None else cls(pid, started)

    @classmethod
    def from_state(cls, pid: object, started: object) -> ProcessRef | None:
        if isinstance(pid, int) and isinstance(started, int):
            return cls(pid, started)
        return None

    def alive(self) -> bool:
        """True while any thread of the process runs. A JVM's main thread can exit (its PID then
        reads as a zombie, with an empty cmdline) while the shutdown hooks still run on others."""
        if _start_ticks(self.pid) != self.started:
            return False
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            threads = len(os.listdir(f"/proc/{self.pid}/task"))
        except (OSError, IndexError):
            return False
        return state not in ("Z", "X") or threads > 1


def command_name(pid: int) -> str:
    """The process's name (``/proc/PID/comm``), or ``""`` when there is no such process."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


#: The account the local PostgreSQL runs as when the stack is started by root (PostgreSQL refuses to run
#: as root). The stack's own, not ``nobody``: any other daemon running as ``nobody`` could read every
#: tenant's data. Created as a system account (no login, no home) the first time it is needed.
STACK_ACCOUNT = "agentstream"


@dataclass(frozen=True)
class RunAs:
    """An unprivileged account to run a server as (PostgreSQL refuses to run as root)."""

    user: str
    uid: int
    gid: int

    @classmethod
    def for_postgres(cls) -> RunAs | None:
        """``None`` when we are not root (the server runs as the current user); else ``AGENTSTREAM_PG_USER``
        when set (it must exist), or the stack's own account ``STACK_ACCOUNT``, created when missing."""
        if os.geteuid() != 0:
            return None
        name = os.environ.get("AGENTSTREAM_PG_USER")
        if name:
            try:
                entry = pwd.getpwnam(name)
            except KeyError as exc:
                raise StackError(
                    f"running as root, PostgreSQL needs an unprivileged account and AGENTSTREAM_PG_USER names "
                    f"'{name}', which does not exist; create it or unset AGENTSTREAM_PG_USER (then the stack "
                    f"creates and uses its own account, '{STACK_ACCOUNT}')"
                ) from exc
        else:
            entry = ensure_system_account(STACK_ACCOUNT)
        if entry.pw_uid == 0:
            raise StackError(f"account '{entry.pw_name}' is root (uid 0): PostgreSQL needs an unprivileged one")
        return cls(user=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid)

    def chown(self, path: Path) -> None:
        os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def chown_tree(self, root: Path) -> None:
        """``root`` and everything under it (symlinks themselves, not what they name)."""
        self.chown(root)
        for directory, dirs, files in os.walk(root):
            for name in (*dirs, *files):
                self.chown(Path(directory) / name)

    def popen_kwargs(self) -> dict:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def ensure_system_account(name: str, *, attempts: int = 20) -> pwd.struct_passwd:
    """The account ``name``, created with ``useradd`` when missing: a system account with its own group,
    no home directory and no login shell. Several ``dev up`` or test sessions may create it at once: one
    wins, the others find it (``useradd`` exits 9, or 10 while another holds ``/etc/passwd``'s lock)."""
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    for _ in range(attempts):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        try:
            made = subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir",
                                   "/nonexistent", "--shell", "/usr/sbin/nologin", "--comment",
                                   "agentstream dev stack", name], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StackError(f"running as root, the local PostgreSQL runs as the account '{name}', which could not be "
                             f"created ({exc}); create it, or set AGENTSTREAM_PG_USER to an unprivileged account") from exc
        if made.returncode not in (0, 9, 10):
            raise StackError(f"running as root, the local PostgreSQL runs as the account '{name}', which could not be "
                             f"created (useradd exit {made.returncode}: {(made.stdout + made.stderr).strip()}); "
                             "create it, or set AGENTSTREAM_PG_USER to an unprivileged account")
        if made.returncode == 10:
            time.sleep(0.25)
    return pwd.getpwnam(name)  # KeyError here means something deletes it as fast as it is made


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    run_as: RunAs | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    umask: int = -1,
) -> subprocess.CompletedProcess[str]:
    """Run a short command to completion; raise ``StackError`` with its output when it fails. ``umask``:
    the command's (``files.PRIVATE_UMASK`` for the stack's servers and tools; -1 keeps ours)."""
    try:
        proc = subprocess.run(
            list(argv),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            umask=umask,
            **(run_as.popen_kwargs() if run_as else {}),
        )
    except FileNotFoundError as exc:
        raise StackError(f"{argv[0]} not found: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{' '.join(argv[:3])}… did not finish within {timeout:.0f} s") from exc
    if proc.returncode != 0:
        out = (proc.stdout + proc.stderr).strip()[-2000:]
        raise StackError(f"{' '.join(argv[:3])}… failed (exit {proc.returncode}):\n{out}")
    return proc


def spawn_detached(argv: Sequence[str], *, log_file: Path, env: Mapping[str, str] | None = None,
                   umask: int = PRIVATE_UMASK) -> subprocess.Popen[bytes]:
    """Start a long-running server in its own session with output to ``log_file`` (0600: a server's log
    can quote what it was sent) and, by default, umask 077 (what it creates is its owner's only).

    The caller watches the start with ``Popen.poll()`` and then keeps a ``ProcessRef``: the server
    outlives this process, so the ``Popen`` object is not kept.
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(open_private_log(log_file), "ab") as log, open(os.devnull, "rb") as devnull:
        proc = subprocess.Popen(
            list(argv),
            stdin=devnull,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            close_fds=True,
            umask=umask,
        )
    return proc


def _reap(pid: int) -> None:
    """Collect ``pid`` if it is our child, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _wait_gone(ref: ProcessRef, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        _reap(ref.pid)
        if not ref.alive():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop(ref: ProcessRef | None, *, grace: float = 30.0, sig: signal.Signals = signal.SIGTERM) -> bool:
    """Send ``sig`` (SIGTERM by default), then SIGKILL (by PID only) if the process is still there
    after ``grace`` seconds.

    Returns True when a process was stopped, False when it was not running.
    """
    if ref is None or not ref.alive():
        return False
    try:
        os.kill(ref.pid, sig)
    except ProcessLookupError:
        return False
    if not _wait_gone(ref, grace):
        try:
            os.kill(ref.pid, signal.SIGKILL)
        except ProcessLookupError:
            return True
        _wait_gone(ref, 10)
    return True


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
