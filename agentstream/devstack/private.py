"""A Kafka broker and a PostgreSQL server of one's own, to break on purpose.

Tests and benchmarks that stop the database, kill the broker or restart either must not do it to the
shared development stack (other tests, a developer's own runs). ``PrivateStack`` starts both from the
same launchers ``agentstream dev up`` uses, in a state directory of its own, on free ports (never the
shared stack's), and can stop, kill and restart each one. It reads no connection settings from the
environment (``KAFKA_BOOTSTRAP_SERVERS`` may name another cluster), and it keeps a state file in the
``dev up`` format, so data kept after ``close(keep_data=True)`` can be brought back with
``AGENTSTREAM_STATE_DIR=<state dir> agentstream dev up`` to look at.

    stack = PrivateStack(tmp_path / "state")
    await stack.start()
    settings = stack.settings(topic_prefix="t1.")
    await stack.stop_postgres()   # fast shutdown: every client loses its connection
    await stack.start_postgres()
    await stack.kill_kafka()      # SIGKILL, no clean shutdown
    await stack.start_kafka()
    await stack.close()

``PrivateStack(state_dir, brokers=3)`` runs a three-node cluster (``KafkaCluster``, as ``agentstream dev
up --brokers 3``); ``kill_kafka(node=2)``, ``stop_kafka(node=2)`` (a clean shutdown) and
``start_kafka()`` (whichever nodes are down) then act on single nodes.

``PrivateStack(state_dir, secure=True)`` runs Kafka as ``agentstream dev up --secure`` does (SASL/SCRAM, a
principal per service, ACLs): ``settings(principal="client")`` and ``env("planner")`` connect as one of
them, ``await stack.grant(topics)`` creates a prefix's topics and ACLs as the administrator.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
from collections.abc import Mapping
from pathlib import Path

from agentstream.devstack import files, process
from agentstream.devstack.kafka import KafkaCluster, KafkaLauncher, node_refs, node_state
from agentstream.devstack.postgres import PostgresLauncher, default_work_dir
from agentstream.devstack.secure import DATABASE_LOGINS, StackSecrets, create_database_logins
from agentstream.ops.acls import ADMIN, acl_bindings, apply_acls, tenant_principal
from agentstream.ops.client_quotas import TenantKafkaQuota, apply_client_quotas
from agentstream.streams.config.kafka_auth import KafkaAuth
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
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.store import migrations

_SHARED_PORTS = frozenset({DEFAULT_KAFKA_PORT, DEFAULT_KAFKA_PORT + 1, DEFAULT_POSTGRES_PORT})


#: Private stacks take their ports below Linux's default ephemeral range (32768-60999): a port the
#: kernel hands out for binding to 0 can be given to some client's outgoing connection between the
#: moment it is chosen and the moment the server binds it (seen in CI: Kafka's controller port, taken
#: while a busy test suite opened connections). Below the range, only listeners compete.
_PRIVATE_PORTS = range(20000, 32000)


def _free_ports(count: int, what: str) -> int:
    """The first of ``count`` consecutive ports that are free now, none of them a shared stack's."""
    for _ in range(200):
        port = random.randrange(_PRIVATE_PORTS.start, _PRIVATE_PORTS.stop - count)
        ports = set(range(port, port + count))
        if not ports & _SHARED_PORTS and not any(process.port_in_use("127.0.0.1", p) for p in ports):
            return port
    raise StackError(f"no {count} consecutive free ports for {what}")


def free_kafka_port(nodes: int = 1) -> int:
    """A free port followed by ``2 * nodes - 1`` free ones (each node's controller listens on the port
    after its broker's; node n's broker on ``port + 2(n-1)``)."""
    return _free_ports(2 * nodes, "Kafka")


def _free_port() -> int:
    return _free_ports(1, "PostgreSQL")


class PrivateStack:
    """Kafka and PostgreSQL in ``state_dir`` on free ports (see the module docstring)."""

    def __init__(self, state_dir: Path, *, brokers: int = 1, broker_overrides: dict[str, str] | None = None,
                 secure: bool = False, tenants: tuple[str, ...] = (),
                 tenant_quotas: Mapping[str, TenantKafkaQuota] | None = None) -> None:
        defaults = StackPaths.from_env()
        #: Each tenant's Kafka quota (a tenant not named: ``TenantKafkaQuota.load()``, as ``dev up`` sets it).
        self.tenant_quotas = {tenant: (tenant_quotas or {}).get(tenant) or TenantKafkaQuota.load() for tenant in tenants}
        self.paths = StackPaths(cache_dir=defaults.cache_dir, state_dir=state_dir, infra_dir=defaults.infra_dir)
        self.secrets = StackSecrets.ensure(state_dir / "secrets", tenants) if secure else None
        self.cluster = KafkaCluster(infra_dir=self.paths.infra_dir, cache_dir=self.paths.cache_dir,
                                    work_dir=state_dir / "kafka", port=free_kafka_port(brokers), size=brokers,
                                    overrides=broker_overrides or {}, secrets=self.secrets)
        #: Node 1 (the only one unless ``brokers`` > 1).
        self.kafka: KafkaLauncher = self.cluster.nodes[0]
        run_as = process.RunAs.for_postgres()
        self.postgres = PostgresLauncher(infra_dir=self.paths.infra_dir, work_dir=default_work_dir(state_dir, run_as),
                                         port=_free_port(), database=DEFAULT_DATABASE, run_as=run_as,
                                         password_file=self.secrets.db_path("postgres") if self.secrets else None,
                                         state_dir=state_dir)

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap

    @property
    def database_url(self) -> str:
        """The schema owner's (the superuser's)."""
        return self.postgres.url

    def database_url_for(self, login: str | None) -> str:
        """A secure stack's URL for one of its logins (``client``, ``approver``); None: the owner's."""
        if not (self.secrets and login):
            return self.database_url
        return f"postgresql://{login}:{self.secrets.db_password(login)}@{self.postgres.host}:{self.postgres.port}/" \
               f"{self.postgres.database}"

    def auth(self, principal: str = ADMIN) -> KafkaAuth:
        """How ``principal`` connects (unauthenticated unless the stack is secure)."""
        return self.secrets.auth(principal) if self.secrets else KafkaAuth()

    def settings(self, *, topic_prefix: str = "", partitions: int = 4, session_timeout_ms: int = 6000,
                 principal: str = ADMIN, database_login: str | None = None) -> Settings:
        """Settings for this stack only (nothing from the environment's connection variables); on a
        secure stack as Kafka ``principal`` and PostgreSQL ``database_login`` (None: the owner), taking
        approvals only as recorded by an approver's login."""
        return Settings(kafka_bootstrap=self.bootstrap, database_url=self.database_url_for(database_login),
                        approvals="recorded" if self.secrets else "open", external_kafka=True,
                        external_database=True, paths=self.paths, topic_prefix=topic_prefix, partitions=partitions,
                        replication_factor=min(3, self.cluster.size), session_timeout_ms=session_timeout_ms,
                        kafka_auth=self.auth(principal))

    def env(self, principal: str | None = None) -> dict[str, str]:
        """What a child process needs to use this stack (and only this stack); on a secure stack, as Kafka
        ``principal`` (its password by file, as a deployment would give it) and its own database login
        when it has one (the services, the client; else the owner's)."""
        own_login = self.secrets is not None and principal is not None and principal in DATABASE_LOGINS
        env = {"KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
               "DATABASE_URL": self.database_url_for(principal if own_login else None),
               "AGENTSTREAM_STATE_DIR": str(self.paths.state_dir),
               "AGENTSTREAM_KAFKA_PORT": str(self.kafka.port), "AGENTSTREAM_PG_PORT": str(self.postgres.port)}
        if self.secrets:
            env["AGENTSTREAM_APPROVALS"] = "recorded"
        if self.secrets and principal:
            env.update(AGENTSTREAM_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT", AGENTSTREAM_KAFKA_USERNAME=principal,
                       AGENTSTREAM_KAFKA_PASSWORD_FILE=str(self.secrets.path(principal)))
        return env

    async def grant(self, topics: Topics, *, client: str = "client") -> None:
        """Create ``topics`` (the catalogue under their prefix) and, on a secure stack, the ACLs that let
        each principal use them — the client's rights going to ``client`` (a tenant's principal on its
        prefix) — as the administrator (what ``agentstream dev up`` does for its own)."""
        admin = self.auth(ADMIN)
        await ensure_topics(self.bootstrap, topics.specs(), auth=admin)
        if admin.sasl:
            await apply_acls(self.bootstrap, admin, acl_bindings(topics, client=client))

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Both servers (in parallel), then the migrations. The state directory is made private (0700,
        as ``agentstream dev up`` makes its own)."""
        files.private_dir(self.paths.state_dir)
        self._record(kafka=self.bootstrap, kafka_port=self.kafka.port, kafka_controller_port=self.kafka.controller_port,
                     kafka_dir=str(self.kafka.work_dir), kafka_brokers=self.cluster.size, database_url=self.database_url,
                     postgres_port=self.postgres.port, postgres_dir=str(self.postgres.work_dir),
                     kafka_security="SASL_PLAINTEXT" if self.secrets else None,
                     secrets_dir=str(self.secrets.directory) if self.secrets else None)
        await asyncio.gather(self.start_kafka(), self.start_postgres())
        await migrations.migrate(self.database_url)
        if self.secrets:
            await create_database_logins(self.database_url, self.secrets)
            await apply_client_quotas(self.bootstrap, self.auth(ADMIN),
                                      {tenant_principal(t): quota for t, quota in self.tenant_quotas.items()})

    async def close(self, *, keep_data: bool = False) -> None:
        """Stop both servers; delete their data unless ``keep_data`` (as root PostgreSQL's is outside the
        state directory, under ``/var/lib/agentstream-postgres``: nothing else would remove it)."""
        await asyncio.gather(*(asyncio.to_thread(KafkaLauncher.stop, ref) for ref in self._nodes().values()))
        await asyncio.to_thread(PostgresLauncher.stop, self._ref("postgres"))
        self._record(kafka_pid=None, kafka_started=None, kafka_nodes=None, postgres_pid=None, postgres_started=None)
        if not keep_data:
            for node in self.cluster.nodes:
                shutil.rmtree(node.work_dir, ignore_errors=True)
            self.postgres.remove()

    # -- faults ------------------------------------------------------------------------------------
    async def start_kafka(self) -> None:
        """Start the nodes that are not running, on their data; returns once the cluster lists them all."""
        down = {n for n, ref in self._nodes().items() if ref is None or not ref.alive()}
        started = await asyncio.to_thread(self.cluster.start, down)
        self._record(**node_state(read_state(self.paths.state_file), started))

    async def kill_kafka(self, node: int = 1) -> None:
        """SIGKILL a node (no clean shutdown) and wait until it is gone."""
        ref = self._live(node)
        os.kill(ref.pid, signal.SIGKILL)
        await asyncio.to_thread(process.stop, ref, grace=30)  # returns once the JVM is gone

    async def stop_kafka(self, node: int = 1) -> None:
        """A clean shutdown of a node (SIGTERM: it hands its partitions' leadership over first)."""
        await asyncio.to_thread(KafkaLauncher.stop, self._live(node))

    def kafka_pid(self, node: int = 1) -> int | None:
        ref = self._nodes().get(node)
        return ref.pid if ref is not None and ref.alive() else None

    def postgres_pid(self) -> int | None:
        ref = self._ref("postgres")
        return ref.pid if ref is not None and ref.alive() else None

    def _live(self, node: int) -> process.ProcessRef:
        ref = self._nodes().get(node)
        if ref is None or not ref.alive():
            raise StackError(f"the private cluster's node {node} is not running")
        return ref

    def _nodes(self) -> dict[int, process.ProcessRef | None]:
        return node_refs(read_state(self.paths.state_file))

    async def start_postgres(self) -> None:
        ref = await asyncio.to_thread(self.postgres.start)
        self._record(postgres_pid=ref.pid, postgres_started=ref.started)

    async def stop_postgres(self) -> None:
        """Fast shutdown (``pg_ctl stop -m fast``): sessions are rolled back, every client is cut off."""
        pg = self.postgres
        bin_dir = await asyncio.to_thread(pg.bin_dir)
        await asyncio.to_thread(process.run, [str(bin_dir / "pg_ctl"), "-D", str(pg.data_dir), "-m", "fast", "-w",
                                              "stop"], run_as=pg.run_as, cwd=pg.work_dir)

    # -- the state file ----------------------------------------------------------------------------
    def _ref(self, name: str) -> process.ProcessRef | None:
        state = read_state(self.paths.state_file)
        return process.ProcessRef.from_state(state.get(f"{name}_pid"), state.get(f"{name}_started"))

    def _record(self, **changes: object) -> None:
        """The state file in ``dev up``'s format, always naming the servers now running."""
        state = {**read_state(self.paths.state_file), **changes}
        write_state(self.paths.state_file, {k: v for k, v in state.items() if v is not None})


__all__ = ["PrivateStack", "free_kafka_port"]
