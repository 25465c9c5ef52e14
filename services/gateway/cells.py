"""Tenants to cells, and whose run is whose.

A tenant is a cell of the pipeline: its own topics under the prefix ``<tenant>.`` and its own workers
(docs/security.md, "Tenants"). The gateway submits a tenant's tasks into the tenant's cell, so the tenant of
a run is where it runs, as for any other client; it keeps one ``AgentClient`` per cell (started on the
cell's first request) and, once the cell has a stream, one ``Hub``. The default tenant
(``GatewaySettings.default_tenant``) is the gateway's own prefix (``AGENTSTREAM_TOPIC_PREFIX``, usually
empty: a stack without tenants).

Reads go to PostgreSQL, shared by the cells: a run is the caller's only if its state records the caller's
prefix, and anything else is answered as if it did not exist (404), so a tenant cannot even learn that
another tenant's run id is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from datetime import datetime

import asyncpg

from agentstream.services.gateway.hub import Hub
from agentstream.services.gateway.metrics import GatewayMetrics
from agentstream.services.gateway.problems import Problem
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.kinds import TERMINAL_STATUSES
from agentstream.streams.core.outages import DATABASE, outage_of
from agentstream.streams.kafka.claims import ClaimStore


@dataclass
class Cell:
    """One tenant's part of the pipeline: its prefix, its client and (once streamed) its hub."""

    tenant: str
    settings: Settings
    #: Reads (PostgreSQL) work at once; what needs Kafka waits for ``Cells.connected``.
    client: AgentClient
    started: bool = False
    hub: Hub | None = None

    @property
    def prefix(self) -> str:
        return self.settings.topic_prefix


@dataclass(frozen=True)
class RunRef:
    """What the gateway needs to know of a run before it answers about it."""

    run_id: str
    prefix: str
    status: str
    submitted_at: datetime
    output: str | None
    session: str | None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES


class Cells:
    """The cells this replica has served, started on first use; and the run lookups they share."""

    def __init__(self, settings: Settings, gateway: GatewaySettings, metrics: GatewayMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.gateway = gateway
        self.cells: dict[str, Cell] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._pool: asyncpg.Pool | None = None
        self._pool_lock = asyncio.Lock()

    def prefix_of(self, tenant: str) -> str:
        return self.settings.topic_prefix if tenant == self.gateway.default_tenant else f"{tenant}."

    def get(self, tenant: str) -> Cell:
        """The tenant's cell, for reads (its client is not connected to Kafka yet: ``connected``)."""
        cell = self.cells.get(tenant)
        if cell is None:
            settings = replace(self.settings, topic_prefix=self.prefix_of(tenant))
            cell = self.cells[tenant] = Cell(tenant, settings, AgentClient(settings))
        return cell

    async def connected(self, cell: Cell) -> AgentClient:
        """The cell's client, connected (``TopicsMissing``, a 503, for a cell whose topics no worker made)."""
        if not cell.started:
            async with self._locks.setdefault(cell.tenant, asyncio.Lock()):
                if not cell.started:
                    try:
                        await cell.client.start()
                    except Exception:  # a client that failed to start cannot start again: a fresh one
                        failed, cell.client = cell.client, AgentClient(cell.settings)
                        with contextlib.suppress(Exception):
                            await failed.close()
                        raise
                    cell.started = True
        return cell.client

    async def hub(self, cell: Cell) -> Hub:
        if cell.hub is not None:
            return cell.hub
        await self.connected(cell)
        async with self._locks.setdefault(f"hub:{cell.tenant}", asyncio.Lock()):
            if cell.hub is None:
                client = cell.client

                async def claims() -> ClaimStore:
                    return ClaimStore(await client.pool())

                hub = Hub(cell.settings, client.runtime.codec, queue_size=self.gateway.stream_queue,
                          history_events=self.gateway.history_events, history_s=self.gateway.history_s,
                          claims=claims, metrics=self.metrics)
                await hub.start()
                cell.hub = hub
        return cell.hub

    async def pool(self) -> asyncpg.Pool:
        """The gateway's own PostgreSQL pool: tokens and the run lookups (each cell's client has its own
        for what the client reads)."""
        if self._pool is None:
            async with self._pool_lock:
                if self._pool is None:
                    self._pool = await asyncpg.create_pool(self.settings.database_url, min_size=1, max_size=8)
        return self._pool

    async def close(self) -> None:
        for cell in list(self.cells.values()):
            if cell.hub is not None:
                await cell.hub.close()
            await cell.client.close()
        self.cells.clear()
        if self._pool is not None:
            await self._pool.close()

    # -- runs ------------------------------------------------------------------------------------
    async def find(self, run_id: str) -> RunRef | None:
        try:
            row = await (await self.pool()).fetchrow(
                """SELECT coalesce(state ->> 'topic_prefix', '') AS prefix, status, submitted_at,
                          state ->> 'output' AS output, state ->> 'session' AS session FROM runs WHERE run_id = $1""",
                run_id)
        except Exception as exc:
            if outage_of(exc) == DATABASE:
                raise Problem(503, f"PostgreSQL is unavailable ({type(exc).__name__}); try again later",
                              headers={"Retry-After": "5"}) from exc
            raise
        if row is None:
            return None
        return RunRef(run_id, row["prefix"], row["status"], row["submitted_at"], row["output"], row["session"])

    async def owned(self, cell: Cell, run_id: str, *, wait: bool = True) -> RunRef:
        """The run, if it is ``cell``'s; else 404. A run PostgreSQL does not know yet (submitted a moment
        ago, its planner has not recorded it) is waited for a little (``unknown_run_wait_s``)."""
        deadline = time.monotonic() + (self.gateway.unknown_run_wait_s if wait else 0.0)
        pause = 0.002
        while True:
            ref = await self.find(run_id)
            if ref is not None:
                if ref.prefix != cell.prefix:
                    break
                return ref
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.25)  # a run just submitted shows up within milliseconds; one that never will, not
        raise Problem(404, f"no run {run_id!r}", slug="run-not-found")

    async def owned_ids(self, cell: Cell, run_ids: list[str]) -> set[str]:
        rows = await (await self.pool()).fetch(
            "SELECT run_id FROM runs WHERE run_id = ANY($1::text[]) AND coalesce(state ->> 'topic_prefix', '') = $2",
            run_ids, cell.prefix)
        return {r["run_id"] for r in rows}


__all__ = ["Cell", "Cells", "RunRef"]
