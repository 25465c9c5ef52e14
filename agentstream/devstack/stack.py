"""``agentstream dev up | down | status``: the local Kafka + PostgreSQL stack as one unit.

The state file (``<state dir>/stack.json``) records the bootstrap servers, the ``DATABASE_URL``, the
PIDs and directories; every other command reads it through ``agentstream.streams.config.settings.Settings``. A user's own
cluster or database (``KAFKA_BOOTSTRAP_SERVERS`` / ``DATABASE_URL``) is used instead of the local one
and never started or stopped by us.

The state directory is its owner's only: 0700, and every directory under it 0700 and every file 0600
(fixed by every ``up``; the servers run with umask 077). As root, PostgreSQL's data is outside it
(``postgres.default_work_dir``), private to the stack's own account; ``down --purge`` removes both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentstream.devstack import files, process
from agentstream.devstack.kafka import KafkaCluster, KafkaLauncher, metadata_ok, node_refs, node_state
from agentstream.devstack.postgres import PostgresLauncher, default_work_dir
from agentstream.devstack.secure import StackSecrets, create_database_logins
from agentstream.ops.acls import acl_bindings, apply_acls, tenant_prefix, tenant_principal
from agentstream.ops.client_quotas import TenantKafkaQuota, apply_client_quotas, tenant_quotas
from agentstream.streams.config.env import dev_ports
from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.config.masking import mask_url, masked_repr
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import (
    DEFAULT_DATABASE,
    DEFAULT_KAFKA_PORT,
    DEFAULT_POSTGRES_PORT,
    StackPaths,
    read_state,
    write_state,
)
from agentstream.streams.core.errors import StackError
from agentstream.streams.kafka.topic_admin import ensure_topics, wait_for_group_coordinator
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.store import migrations


@dataclass(frozen=True)
class Broker:
    """One node of the local Kafka cluster."""

    node_id: int
    address: str
    running: bool
    pid: int | None = None


@dataclass(frozen=True)
class StackStatus:
    kafka: str
    database_url: str
    running: bool
    kafka_running: bool
    postgres_running: bool
    kafka_pid: int | None = None
    postgres_pid: int | None = None
    #: The local cluster's nodes (none for a user's own cluster).
    brokers: tuple[Broker, ...] = ()
    #: Kafka with SASL/SCRAM and ACLs (``dev up --secure``).
    secure: bool = False

    def __repr__(self) -> str:
        return masked_repr(self)

    @property
    def pids(self) -> list[int]:
        return [pid for pid in (self.kafka_pid, self.postgres_pid) if pid]

    def public(self) -> dict:
        """The documented shape of ``agentstream dev status --json``, passwords masked (it is printed, and
        logs keep it): a program that connects reads ``Settings.load()``, i.e. the state file."""
        return {"kafka": mask_url(self.kafka), "database_url": mask_url(self.database_url), "running": self.running,
                "secure": self.secure, "brokers": [{"node_id": b.node_id, "address": mask_url(b.address), "running": b.running, "pid": b.pid}
                            for b in self.brokers]}


class DevStack:
    """Start, stop and inspect the local stack described by ``paths``."""

    def __init__(self, paths: StackPaths | None = None) -> None:
        self.paths = paths or StackPaths.from_env()

    # -- launchers -------------------------------------------------------------------------------
    def _kafka(self, port: int, controller_port: int, secrets: StackSecrets | None = None) -> KafkaLauncher:
        return KafkaLauncher(infra_dir=self.paths.infra_dir, cache_dir=self.paths.cache_dir,
                             work_dir=self.paths.state_dir / "kafka", port=port,
                             controller_port=controller_port, secrets=secrets)

    def _cluster(self, port: int, brokers: int, secrets: StackSecrets | None = None) -> KafkaCluster:
        return KafkaCluster(infra_dir=self.paths.infra_dir, cache_dir=self.paths.cache_dir,
                            work_dir=self.paths.state_dir / "kafka", port=port, size=brokers, secrets=secrets)

    @property
    def secrets_dir(self) -> Path:
        return self.paths.state_dir / "secrets"

    def _postgres(self, port: int, secrets: StackSecrets | None = None) -> PostgresLauncher:
        run_as = process.RunAs.for_postgres()
        return PostgresLauncher(infra_dir=self.paths.infra_dir,
                                work_dir=default_work_dir(self.paths.state_dir, run_as),
                                port=port, database=DEFAULT_DATABASE, run_as=run_as,
                                password_file=secrets.db_path("postgres") if secrets else None,
                                state_dir=self.paths.state_dir)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Serialise concurrent ``up``/``down`` calls on the same state directory (made 0700 here: every
        command that changes the stack comes through)."""
        files.private_dir(self.paths.state_dir)
        with open(os.open(self.paths.state_dir / ".lock", os.O_WRONLY | os.O_CREAT, 0o600), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _write_state(self, state: dict) -> None:
        write_state(self.paths.state_file, state)

    # -- commands --------------------------------------------------------------------------------
    def status(self) -> StackStatus:
        settings = Settings.load(self.paths)
        state = read_state(self.paths.state_file)
        kafka_ref, postgres_ref = _ref(state, "kafka"), _ref(state, "postgres")
        brokers: tuple[Broker, ...] = ()
        if settings.external_kafka:
            kafka_running = asyncio.run(metadata_ok(settings.kafka_bootstrap, auth=settings.kafka_auth))
        else:
            refs = node_refs(state)
            addresses = settings.kafka_bootstrap.split(",")
            brokers = tuple(Broker(n, addresses[n - 1] if n <= len(addresses) else "", bool(ref and ref.alive()),
                                   ref.pid if ref and ref.alive() else None) for n, ref in refs.items())
            kafka_running = all(b.running for b in brokers)
        if settings.external_database:
            url = urlsplit(settings.database_url)
            postgres_running = process.can_connect(url.hostname or "127.0.0.1", url.port or 5432)
        else:
            postgres_running = postgres_ref is not None and postgres_ref.alive()
        return StackStatus(
            kafka=settings.kafka_bootstrap, database_url=settings.database_url,
            running=kafka_running and postgres_running, kafka_running=kafka_running,
            postgres_running=postgres_running,
            kafka_pid=kafka_ref.pid if kafka_ref and kafka_running and not settings.external_kafka else None,
            postgres_pid=postgres_ref.pid if postgres_ref and postgres_running
            and not settings.external_database else None, brokers=brokers,
            secure=settings.kafka_auth.sasl,
        )

    def up(self, *, kafka_port: int | None = None, pg_port: int | None = None,
           brokers: int | None = None, secure: bool | None = None,
           tenants: tuple[str, ...] | None = None) -> StackStatus:
        """Start whatever is not running yet, apply migrations, record the state. Idempotent.

        Kafka's controller listens on the port after the broker's (``kafka_port + 1``). ``brokers``:
        1 (the default) or a cluster of that many nodes (``KafkaCluster``: node n on ``kafka_port +
        2(n-1)``); a node of a running cluster that died is started again. ``secure``: SASL/SCRAM with a
        principal per service and the client, and ACLs (docs/security.md); None keeps what the stack has.
        ``tenants`` (secure only): a cell of topics, a Kafka principal and database logins each (fixed
        when the broker's storage is formatted: changing them needs a purge).
        """
        env_kafka_port, env_pg_port = dev_ports()
        with self._locked():
            settings = Settings.load(self.paths)
            state = read_state(self.paths.state_file)
            before = self.status()
            kafka_port = kafka_port or env_kafka_port or state.get("kafka_port") or DEFAULT_KAFKA_PORT
            pg_port = pg_port or env_pg_port or state.get("postgres_port") or DEFAULT_POSTGRES_PORT
            recorded_brokers = int(state.get("kafka_brokers") or 1)
            brokers = brokers or recorded_brokers
            if brokers < 1:
                raise StackError("--brokers must be at least 1")
            if brokers != recorded_brokers and any(b.running for b in before.brokers):
                raise StackError(f"Kafka is running with {recorded_brokers} broker(s); run `agentstream dev down "
                                 f"--purge` before starting {brokers}")
            if brokers != recorded_brokers and state.get("kafka_dir") and Path(state["kafka_dir"]).exists():
                raise StackError(f"the stack's Kafka data is a {recorded_brokers}-broker cluster's; run "
                                 f"`agentstream dev down --purge` before starting {brokers}")
            was_secure = bool(state.get("secrets_dir"))
            secure = was_secure if secure is None else secure
            if secure != was_secure and any(state.get(k) and Path(state[k]).exists() for k in ("kafka_dir", "postgres_dir")):
                raise StackError(f"the stack runs {'with' if was_secure else 'without'} authentication; run "
                                 f"`agentstream dev down --purge` before starting it {'with' if secure else 'without'}")
            recorded_tenants = tuple(state.get("tenants") or ())
            tenants = recorded_tenants if tenants is None else tuple(dict.fromkeys(tenants))
            if tenants and not secure:
                raise StackError("tenants need the secure stack (agentstream dev up --secure --tenant NAME)")
            if tenants != recorded_tenants and state.get("kafka_dir") and Path(state["kafka_dir"]).exists():
                raise StackError("the stack's tenants are fixed when its broker is formatted; run `agentstream dev "
                                 "down --purge` before changing them")
            for tenant in tenants:
                if not tenant.replace("-", "").isalnum() or not tenant.islower():
                    raise StackError(f"tenant name {tenant!r}: lower-case letters, digits and '-' only")
            secrets = StackSecrets.ensure(self.secrets_dir, tenants) if secure else None
            for name, running, asked, recorded in (
                ("Kafka", before.kafka_running, kafka_port, state.get("kafka_port")),
                ("PostgreSQL", before.postgres_running, pg_port, state.get("postgres_port")),
            ):
                if running and recorded and asked != recorded:
                    raise StackError(f"{name} is already running on port {recorded}; "
                                     "run `agentstream dev down` before choosing another port")
            files.restrict_tree(self.paths.state_dir)  # what an older version left readable, too
            kafka = self._kafka(kafka_port, kafka_port + 1, secrets)
            cluster = self._cluster(kafka_port, brokers, secrets)
            postgres = self._postgres(pg_port, secrets)
            if not settings.external_database and not before.postgres_running and state.get("postgres_dir"):
                postgres.adopt(Path(state["postgres_dir"]))  # the data an older version kept in /var/tmp
            to_start: dict[str, Callable[[], Any]] = {}
            if not settings.external_kafka and not before.kafka_running:
                if brokers == 1:
                    kafka.preflight()
                    to_start["kafka"] = kafka.start
                else:
                    alive = {b.node_id for b in before.brokers if b.running}
                    down = set(range(1, brokers + 1)) - alive
                    for node in cluster.nodes:
                        if node.node_id in down:
                            node.preflight()
                    to_start["kafka"] = lambda: cluster.start(down)
            if not settings.external_database and not before.postgres_running:
                postgres.preflight()
                to_start["postgres"] = postgres.start
            refs = self._start_together(to_start, stop={"kafka": _stop_kafka, "postgres": postgres.stop})
            if "kafka" in refs:
                nodes = refs["kafka"] if isinstance(refs["kafka"], dict) else {1: refs["kafka"]}
                state.update(kafka=kafka.bootstrap if brokers == 1 else cluster.bootstrap, kafka_port=kafka.port,
                             kafka_controller_port=kafka.controller_port, kafka_dir=str(kafka.work_dir),
                             kafka_brokers=brokers, kafka_security="SASL_PLAINTEXT" if secrets else "PLAINTEXT",
                             secrets_dir=str(secrets.directory) if secrets else None, tenants=list(tenants))
                state.update(node_state(state, nodes))
            if "postgres" in refs:
                state.update(approvals="recorded" if secrets else "open",
                             database_url=postgres.url, postgres_port=postgres.port,
                             postgres_dir=str(postgres.work_dir), postgres_pid=refs["postgres"].pid,
                             postgres_started=refs["postgres"].started)
            if refs:
                state["started_at"] = time.time()
                self._write_state(state)
            settings = Settings.load(self.paths)
            stack_secrets = StackSecrets(Path(state["secrets_dir"]), tuple(state.get("tenants") or ())) \
                if state.get("secrets_dir") else None
            admin = stack_secrets.admin if stack_secrets and not settings.external_kafka else settings.kafka_auth
            if not settings.external_database and state.get("database_url"):  # the owner's, not this process's
                settings = dataclasses.replace(settings, database_url=state["database_url"])
            asyncio.run(_prepare(settings, admin, None if settings.external_database else stack_secrets))
            return self.status()

    @staticmethod
    def _start_together(starters: dict[str, Callable[[], Any]],
                        stop: dict[str, Callable[[Any], object]]) -> dict[str, Any]:
        """Start the servers in parallel (cold start is the slower of the two, not the sum); if one
        fails, stop the others so nothing is left half-started."""
        if not starters:
            return {}
        with ThreadPoolExecutor(max_workers=len(starters)) as pool:
            jobs = {name: pool.submit(start) for name, start in starters.items()}
        failed = {name: job.exception() for name, job in jobs.items() if job.exception()}
        if failed:
            for name, job in jobs.items():
                if name not in failed:
                    stop[name](job.result())
            raise StackError("\n".join(f"{name}: {exc}" for name, exc in failed.items()))
        return {name: job.result() for name, job in jobs.items()}

    def down(self, *, purge: bool = False) -> list[str]:
        """Stop what ``up`` started (never a user's own cluster); return what was stopped."""
        stopped: list[str] = []
        with self._locked():
            settings = Settings.load(self.paths)
            state = read_state(self.paths.state_file)
            if not settings.external_kafka and _stop_kafka(node_refs(state)):
                stopped.append("kafka")
            if not settings.external_database and PostgresLauncher.stop(_ref(state, "postgres")):
                stopped.append("postgres")
            for key in ("kafka_pid", "kafka_started", "kafka_nodes", "postgres_pid", "postgres_started"):
                state.pop(key, None)
            if purge:
                for key in ("kafka_dir", "postgres_dir"):
                    if state.get(key):
                        shutil.rmtree(state[key], ignore_errors=True)
                if state.get("kafka_dir"):
                    for n in range(2, int(state.get("kafka_brokers") or 1) + 1):
                        shutil.rmtree(f"{state['kafka_dir']}-{n}", ignore_errors=True)
                shutil.rmtree(self.secrets_dir, ignore_errors=True)  # the purged broker's credentials
                self.paths.state_file.unlink(missing_ok=True)
            elif state:
                self._write_state(state)
        return stopped


async def _prepare(settings: Settings, admin: KafkaAuth, secrets: StackSecrets | None) -> None:
    """Migrations, the catalogue's topics (and on a secure stack their ACLs) and a group coordinator,
    concurrently: the first waits on PostgreSQL, the others on Kafka (a fresh broker takes a second or two
    to create ``__consumer_offsets``). Kafka's part runs as ``admin``: on a secure stack only the super
    user may create topics and ACLs. On a secure stack, the database's client and approver logins follow
    the migrations (which create their roles)."""
    topics = Topics.of(settings)

    async def kafka() -> None:
        await ensure_topics(settings.kafka_bootstrap, topics.specs(), auth=admin)
        if admin.sasl:
            await apply_acls(settings.kafka_bootstrap, admin, acl_bindings(topics))
        for tenant in secrets.tenants if secrets else ():  # each tenant's cell, its own principal's
            cell = dataclasses.replace(topics, prefix=tenant_prefix(tenant))
            await ensure_topics(settings.kafka_bootstrap, cell.specs(), auth=admin)
            await apply_acls(settings.kafka_bootstrap, admin, acl_bindings(cell, client=tenant_principal(tenant)))
        if secrets is not None and secrets.tenants:  # each tenant's produce rate (agentstream/ops/client_quotas.py)
            await apply_client_quotas(settings.kafka_bootstrap, admin,
                                      tenant_quotas(secrets.tenants, TenantKafkaQuota.load()))

    async def database() -> None:
        await migrations.migrate(settings.database_url)
        if secrets is not None:
            await create_database_logins(settings.database_url, secrets)

    await asyncio.gather(database(), kafka(),
                         wait_for_group_coordinator(settings.kafka_bootstrap, auth=admin))


def _ref(state: dict, name: str) -> process.ProcessRef | None:
    return process.ProcessRef.from_state(state.get(f"{name}_pid"), state.get(f"{name}_started"))


def _stop_kafka(refs: process.ProcessRef | dict[int, process.ProcessRef | None] | None) -> bool:
    """Stop one node or all of a cluster's; True when any was running."""
    if not isinstance(refs, dict):
        return KafkaLauncher.stop(refs)
    with ThreadPoolExecutor(max_workers=max(1, len(refs))) as pool:  # each shutdown takes seconds
        return any(list(pool.map(KafkaLauncher.stop, refs.values())))
