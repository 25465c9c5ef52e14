"""Which tools exist: the ``tools`` table, written by tool workers at start, read by submit and the planner.

A tool worker upserts the tools it serves before it joins its consumer group, so a task naming a tool
is accepted only if some worker has said it can run it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg


@dataclass(frozen=True)
class ToolInfo:
    """What the model and the submitter are told about a tool."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=dict)
    requires_approval: bool = False


class ToolCatalog:
    """A cached view of the ``tools`` table (refreshed every ``ttl_s``, or at once on an unknown name)."""

    def __init__(self, pool: asyncpg.Pool, *, ttl_s: float = 5.0) -> None:
        self.pool = pool
        self.ttl_s = ttl_s
        self._tools: dict[str, ToolInfo] = {}
        self._loaded_at = 0.0

    async def refresh(self) -> dict[str, ToolInfo]:
        rows = await self.pool.fetch("SELECT name, description, parameters::text AS p, requires_approval FROM tools")
        self._tools = {r["name"]: ToolInfo(r["name"], r["description"], json.loads(r["p"]), r["requires_approval"])
                       for r in rows}
        self._loaded_at = time.monotonic()
        return self._tools

    async def all(self) -> dict[str, ToolInfo]:
        if time.monotonic() - self._loaded_at > self.ttl_s:
            await self.refresh()
        return self._tools

    async def unknown(self, names: list[str]) -> list[str]:
        """The names no tool worker has registered (after a refresh, so a new worker is seen at once)."""
        tools = await self.all()
        missing = [n for n in names if n not in tools]
        if missing:
            tools = await self.refresh()
            missing = [n for n in names if n not in tools]
        return missing

    async def describe(self, names: list[str]) -> list[ToolInfo]:
        tools = await self.all()
        return [tools[n] for n in names if n in tools]


async def register(pool: asyncpg.Pool, tools: list[ToolInfo], *, worker: str) -> None:
    """Upsert the tools a worker serves."""
    await pool.executemany(
        """INSERT INTO tools (name, description, parameters, requires_approval, registered_by, updated_at)
           VALUES ($1, $2, $3::jsonb, $4, $5, now())
           ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description, parameters = EXCLUDED.parameters,
               requires_approval = EXCLUDED.requires_approval, registered_by = EXCLUDED.registered_by,
               updated_at = now()""",
        [(t.name, t.description, json.dumps(t.parameters), t.requires_approval, worker) for t in tools],
    )
