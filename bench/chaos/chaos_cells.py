"""The chaos suite's cells: where its runs go, which processes serve them, and as whom.

On the default stack there is one cell: no topic prefix, no authentication, two processes of every service
(the faults' targets) and the model server. With ``--secure`` the suite runs where production runs
(issue 36): three Kafka nodes (every topic with three replicas, ``min.insync.replicas=2``), SASL/SCRAM with
ACLs, each service as its own Kafka principal and PostgreSQL login, and two tenants, each a cell of its
own prefix, principal and logins:

- **acme** (the primary cell): the processes the faults aim at, as on the default stack (two of every
  service, a third planner scaled in and out), each as its service's principal; most of the load.
- **beta**: one ``worker all`` process as the ``worker`` principal (the four services in one process, as
  a small tenant would run them), a quarter of acme's load: the other tenant, whose runs must come through
  the broker, database and model faults that hit everyone, and the poison in acme's topics, untouched.

The suite submits as each tenant's own principal and login (``tenant-<name>``) and approves as its approver
login (``approver-<name>``), as a tenant's client would; it checks as the administrator and the schema's
owner. Poison is written as the administrator (a service gone wrong: a tenant may only write tasks).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from agentstream.devstack.private import PrivateStack
from agentstream.ops.acls import ADMIN, tenant_prefix, tenant_principal
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topics import Topics
from bench.chaos.chaos_faults import MODEL_SERVER, SCALE_PLANNER, SERVICES
from bench.chaos.chaos_procs import ProcSpec, child_env, model_server_argv, worker_argv
from bench.chaos.chaos_tools import CREATE_EFFECTS_TABLE, EFFECTS_TABLE

TOOLS_MODULE = "bench.chaos.chaos_tools"
#: The secure stack's tenants: the primary cell first.
TENANTS = ("acme", "beta")
#: Nodes of the secure stack's Kafka cluster.
SECURE_BROKERS = 3
#: The other tenant's share of the primary cell's runs.
SECONDARY_SHARE = 0.25
#: Partitions of a secure cell's topics (the default stack's are the settings' default).
PARTITIONS = 4


@dataclass(frozen=True)
class Cell:
    """One cell of the suite: its tenant (None on the default stack), topics, and share of the load."""

    tenant: str | None
    prefix: str
    primary: bool
    share: float

    @property
    def label(self) -> str:
        return self.tenant or "default"

    def topics(self, stack: PrivateStack) -> Topics:
        """The cell's topics as a secure stack makes them: ``PARTITIONS`` each, replicated on every node
        (up to three)."""
        return Topics.of(stack.settings(topic_prefix=self.prefix, partitions=PARTITIONS))

    def process_names(self) -> list[str]:
        """The primary cell's names are the faults' targets (``planner-1`` …); another cell's are prefixed."""
        if self.primary:
            return [f"{s}-{n}" for s in SERVICES for n in (1, 2)] + [SCALE_PLANNER]
        return [f"{self.tenant}-all"]

    def groups(self) -> dict[str, int]:
        """Each service's consumer group and how many members it has once every process is up."""
        topics = Topics(self.prefix)
        return {topics.group(s): 2 if self.primary else 1 for s in SERVICES}


def cells_for(secure: bool) -> list[Cell]:
    if not secure:
        return [Cell(None, "", primary=True, share=1.0)]
    return [Cell(t, tenant_prefix(t), primary=n == 0, share=1.0 if n == 0 else SECONDARY_SHARE)
            for n, t in enumerate(TENANTS)]


def make_stack(state_dir: Path, secure: bool) -> PrivateStack:
    if not secure:
        return PrivateStack(state_dir)
    return PrivateStack(state_dir, secure=True, brokers=SECURE_BROKERS, tenants=TENANTS)


def specs(stack: PrivateStack, cells: list[Cell], logs: Path, model_port: int,
          extra_env: dict[str, str]) -> list[ProcSpec]:
    """The model server and every cell's workers; on a secure stack each worker connects as its service's
    principal and login."""
    url = f"http://127.0.0.1:{model_port}/v1"
    out = [ProcSpec(MODEL_SERVER, model_server_argv(model_port), child_env(stack, extra_env), logs / f"{MODEL_SERVER}.log")]
    for cell in cells:
        for name in cell.process_names():
            service = name.rsplit("-", 1)[0] if cell.primary else "all"
            principal = ("worker" if service == "all" else service) if stack.secrets is not None else None
            cell_env = {"AGENTSTREAM_TOPIC_PREFIX": cell.prefix}
            if stack.secrets is not None:  # the topics the administrator made for the cell (``prepare``)
                cell_env["AGENTSTREAM_PARTITIONS"] = str(PARTITIONS)
            env = child_env(stack, {**extra_env, **cell_env}, principal)
            out.append(ProcSpec(name, worker_argv(service, url, TOOLS_MODULE), env, logs / f"{name}.log"))
    return out


async def prepare(stack: PrivateStack, cells: list[Cell]) -> None:
    """The effects table (writable by the tools' login on a secure stack) and, on a secure stack, each
    cell's topics and ACLs as the administrator creates them (the services may not create topics)."""
    conn = await asyncpg.connect(stack.database_url)
    try:
        await conn.execute(CREATE_EFFECTS_TABLE)
        if stack.secrets is not None:
            await conn.execute(f"GRANT SELECT, INSERT ON {EFFECTS_TABLE} TO agentstream_tools; "
                               f"GRANT USAGE ON SEQUENCE {EFFECTS_TABLE}_id_seq TO agentstream_tools")
    finally:
        await conn.close()
    if stack.secrets is not None:
        for cell in cells:
            assert cell.tenant is not None
            await stack.grant(cell.topics(stack), client=tenant_principal(cell.tenant))


def client_settings(stack: PrivateStack, cell: Cell, base: Settings) -> tuple[Settings, Settings | None]:
    """How the suite submits into ``cell``, and (secure only) how it approves: as the tenant's principal,
    with its own login for submitting and its approver login for decisions."""
    if stack.secrets is None or cell.tenant is None:
        return dataclasses.replace(base, topic_prefix=cell.prefix), None

    tenant = cell.tenant

    def as_login(login: str) -> Settings:
        return stack.settings(topic_prefix=cell.prefix, partitions=PARTITIONS, principal=tenant_principal(tenant),
                              database_login=login, session_timeout_ms=base.session_timeout_ms)

    return as_login(tenant_principal(cell.tenant)), as_login(f"approver-{cell.tenant}")


def ingest_env(stack: PrivateStack) -> dict[str, str]:
    """``agentstream ingest`` writes the shared documents as the schema's owner (and the administrator)."""
    return child_env(stack, {}, ADMIN if stack.secrets is not None else None)
