"""Where the pipeline benchmark runs: the development stack (the default), or the secure three-node stack
where production runs (``--secure``, issue 36).

The secure stack is a ``PrivateStack`` of its own (free ports, a temporary state directory, removed
afterwards): three KRaft nodes (every topic with three replicas, ``min.insync.replicas=2``), SASL/SCRAM
with ACLs, each worker as its service's own Kafka principal and PostgreSQL login (its password by file),
the benchmark's client as a tenant's principal and login, as a tenant's application would be. The
figures then include what production pays: replication to two followers before an acknowledgement,
SCRAM-authenticated connections, ACL checks on every request, row security in PostgreSQL.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from agentstream.devstack.private import PrivateStack
from agentstream.devstack.stack import DevStack
from agentstream.ops.acls import tenant_prefix, tenant_principal
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topics import Topics

#: The secure stack's one tenant: the benchmark's cell.
TENANT = "bench"
SECURE_BROKERS = 3


@dataclass
class BenchStack:
    """The client's settings, each worker's connection environment, the servers' PIDs (their CPU counts
    into a step's), the owner's database URL (the benchmark reads the events history back as the owner)
    and how to take it all down."""

    settings: Settings
    owner_url: str
    label: str
    server_pids: dict[str, list[int]]
    worker_env: Callable[[str], dict[str, str]]
    close: Callable[[], None] = field(default=lambda: None)


def dev_stack(prefix: str) -> BenchStack:
    """The development stack (``agentstream dev up``: started if it is not running, left running)."""
    status = DevStack().up()
    settings = replace(Settings.load(), kafka_bootstrap=status.kafka, database_url=status.database_url,
                       topic_prefix=prefix)

    def env(service: str) -> dict[str, str]:
        return {"KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url}

    return BenchStack(settings, status.database_url, "dev stack (1 node, no authentication)",
                      {"broker": [status.kafka_pid] if status.kafka_pid else [],
                       "postgres": [status.postgres_pid] if status.postgres_pid else []}, env)


def secure_stack(partitions: int) -> BenchStack:
    """A secure three-node stack of the benchmark's own, the tenant's topics made and granted."""
    workdir = Path(tempfile.mkdtemp(prefix="agentstream-bench-secure-"))
    stack = PrivateStack(workdir / "state", secure=True, brokers=SECURE_BROKERS, tenants=(TENANT,))
    prefix = tenant_prefix(TENANT)

    async def start() -> None:
        await stack.start()
        topics = Topics.of(stack.settings(topic_prefix=prefix, partitions=partitions))  # replicated on all three
        await stack.grant(topics, client=tenant_principal(TENANT))

    asyncio.run(start())
    settings = stack.settings(topic_prefix=prefix, partitions=partitions, principal=tenant_principal(TENANT),
                              database_login=tenant_principal(TENANT))

    def env(service: str) -> dict[str, str]:
        return stack.env("worker" if service == "all" else service)

    def close() -> None:
        asyncio.run(stack.close())
        shutil.rmtree(workdir, ignore_errors=True)

    pids = {"broker": [p for n in range(1, SECURE_BROKERS + 1) if (p := stack.kafka_pid(n)) is not None],
            "postgres": [pid] if (pid := stack.postgres_pid()) is not None else []}
    return BenchStack(settings, stack.database_url, f"secure stack ({SECURE_BROKERS} nodes, SASL/SCRAM + ACLs, "
                      "a principal and login per service)", pids, env, close)

