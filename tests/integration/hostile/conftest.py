"""The hostile-client suite's stack (docs/security.md, "Threat model"): one secure broker and database with
two tenants, as the attack of issue 37 found them, shared by every module of this package.

- **acme**: each service as its own Kafka principal and database login, as separate processes (two
  planners, inference with the scripted model, tools with the built-ins and the test tools). The victim
  of most attacks.
- **beta**: one `worker all` process as the `worker` principal, with quotas (runs in flight 2, 6 steps,
  2,000 tokens a run, 5 tasks a second, a million tokens an hour and a day): the other tenant, and the
  attacker's own cell.

Each tenant's principal has a Kafka produce quota (agentstream/ops/client_quotas.py): acme the default
(1 MiB/s), beta 64 KiB/s (``BETA_PRODUCE_RATE``), a small one so that its flood meets it within a second
or two.

An attacker holds one credential at a time (``tests/integration/acl_probes.send`` publishes as a named
principal); what it may write is what the ACLs allow, and the tests show that writing it changes nothing
it should not.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest_asyncio

from agentstream.devstack.private import PrivateStack
from agentstream.ops.acls import tenant_prefix, tenant_principal
from agentstream.ops.client_quotas import TenantKafkaQuota
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.core.events import DeadLetter
from agentstream.streams.kafka.topics import Topics
from tests.integration.acl_probes import connection, dead_letter
from tests.integration.pipeline_tools import EFFECTS_TABLE
from tests.integration.processes import start_worker, stop, wait_for

ACME, BETA = "acme", "beta"
#: The logs of acme's planners (the first one has a metrics port).
PLANNERS = ("acme-planner", "acme-planner-2")
TENANTS = (ACME, BETA)
PARTITIONS = 4
TOOLS = ["--tools", "agentstream.services.tools.builtin", "--tools", "tests.integration.pipeline_tools"]
#: Bytes per second beta's principal may produce (the broker delays it beyond); acme's has the default.
BETA_PRODUCE_RATE = 64 * 1024
#: Beta's limits (its cell's planner enforces them); acme has none.
QUOTAS_BETA = {"AGENTSTREAM_QUOTA_MAX_STEPS": "6", "AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT": "2",
               "AGENTSTREAM_QUOTA_TOKENS_PER_RUN": "2000", "AGENTSTREAM_QUOTA_TASKS_PER_SECOND": "5",
               "AGENTSTREAM_QUOTA_TOKENS_PER_HOUR": "1000000", "AGENTSTREAM_QUOTA_TOKENS_PER_DAY": "1000000"}


@dataclass
class Cells:
    """The stack, and where its workers write their logs."""

    stack: PrivateStack
    logs: dict[str, Path]

    def topics(self, tenant: str) -> Topics:
        return Topics(tenant_prefix(tenant), partitions=PARTITIONS)

    def client(self, tenant: str, login: str | None = None) -> AgentClient:
        """A client of ``tenant``: its principal, and its own database login unless ``login`` says otherwise."""
        return AgentClient(self.stack.settings(topic_prefix=tenant_prefix(tenant), principal=tenant_principal(tenant),
                                               database_login=login or tenant_principal(tenant)))

    def log_text(self, *names: str) -> str:
        """The workers' logs (``names``: only those, e.g. ``*PLANNERS``)."""
        return "\n".join(path.read_text(errors="replace") for name, path in self.logs.items()
                         if path.exists() and (not names or name in names))

    async def dead_letter(self, tenant: str, source_topic: str, source: tuple[int, int],
                          timeout: float = 60) -> DeadLetter:
        """The dead letter of the record at ``source`` (partition, offset) of ``source_topic``."""
        return await dead_letter(self.stack, tenant_prefix(tenant), source_topic, source, timeout=timeout)

    async def effects(self, run_id: str) -> list[str]:
        """What the test tools did for ``run_id`` (``tests/integration/pipeline_tools.py``)."""
        async with connection(self.stack.database_url) as conn:
            return [r["label"] for r in await conn.fetch(
                "SELECT label FROM test_effects WHERE run_id = $1 ORDER BY id", run_id)]


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def cells(tmp_path_factory) -> AsyncIterator[Cells]:
    directory = tmp_path_factory.mktemp("hostile")
    stack = PrivateStack(directory / "state", secure=True, tenants=TENANTS,
                         tenant_quotas={BETA: TenantKafkaQuota(producer_byte_rate=BETA_PRODUCE_RATE)})
    await stack.start()
    procs = []
    logs: dict[str, Path] = {}

    def start(tenant: str, service: str, principal: str, *args: str, name: str = "", **env: str) -> None:
        name = name or f"{tenant}-{service}"
        logs[name] = directory / f"{name}.log"
        settings = stack.settings(topic_prefix=tenant_prefix(tenant), partitions=PARTITIONS)
        procs.append(start_worker(settings, service, logs[name], *args, **stack.env(principal), **env))

    try:
        async with connection(stack.database_url) as conn:
            await conn.execute(EFFECTS_TABLE)
            await conn.execute("GRANT SELECT, INSERT ON test_effects TO agentstream_tools; "
                               "GRANT USAGE ON SEQUENCE test_effects_id_seq TO agentstream_tools")
        for tenant in TENANTS:
            await stack.grant(Topics(tenant_prefix(tenant), partitions=PARTITIONS), client=tenant_principal(tenant))
        # The planner with a metrics port: its lag sampler once logged GroupAuthorizationFailedError every 5 s.
        start(ACME, "planner", "planner", AGENTSTREAM_METRICS_PORT="0", AGENTSTREAM_TELEMETRY_INTERVAL_S="1")
        start(ACME, "planner", "planner", name="acme-planner-2")  # two: each owns half the partitions
        start(ACME, "inference", "inference")
        start(ACME, "tools", "tools", *TOOLS)
        start(BETA, "all", "worker", *TOOLS, **QUOTAS_BETA)
        result = Cells(stack, logs)
        for tenant in TENANTS:
            async with result.client(tenant) as client:
                catalog = ToolCatalog.for_runtime(client.runtime, ttl_s=0.0)
                try:
                    await wait_for(lambda c=catalog: _has(c, "transfer"), 90, f"tenant {tenant}'s tools")
                finally:
                    await catalog.close()
        yield result
    finally:
        for proc in procs:
            stop(proc)
        await stack.close()


async def _has(catalog: ToolCatalog, tool: str) -> bool:
    return tool in await catalog.refresh()
