"""Workers register their metrics address in PostgreSQL (``workers``, migration 0007) so that
``agentstream top`` finds every worker of a deployment — ports chosen at random included — without
being given a list. A worker refreshes its row while it runs and deletes it when it stops; rows not
refreshed within ``STALE_S`` are ignored (a worker killed with -9) and purged by the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import asyncpg

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
STALE_S = 30.0


async def register(pool: asyncpg.Pool, worker_id: str, services: Sequence[str], metrics_url: str,
                   topic_prefix: str) -> None:
    await pool.execute(
        """INSERT INTO workers (worker_id, services, topic_prefix, metrics_url) VALUES ($1, $2, $3, $4)
           ON CONFLICT (worker_id) DO UPDATE SET services = EXCLUDED.services, topic_prefix = EXCLUDED.topic_prefix,
               metrics_url = EXCLUDED.metrics_url, started_at = now(), heartbeat_at = now()""",
        worker_id, list(services), topic_prefix, metrics_url)
    await pool.execute("DELETE FROM workers WHERE heartbeat_at < now() - make_interval(secs => $1)", STALE_S * 10)


async def heartbeat(pool: asyncpg.Pool, worker_id: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
        try:
            await pool.execute("UPDATE workers SET heartbeat_at = now() WHERE worker_id = $1", worker_id)
        except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
            log.warning("worker heartbeat failed: %s", exc)


async def unregister(pool: asyncpg.Pool, worker_id: str) -> None:
    with contextlib.suppress(asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
        await pool.execute("DELETE FROM workers WHERE worker_id = $1", worker_id)


async def discover(database_url: str, topic_prefix: str) -> list[tuple[str, list[str]]]:
    """(metrics URL, services) of the live workers under ``topic_prefix``."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            """SELECT metrics_url, services FROM workers
               WHERE topic_prefix = $1 AND heartbeat_at > now() - make_interval(secs => $2) ORDER BY worker_id""",
            topic_prefix, STALE_S)
    finally:
        await conn.close()
    return [(r["metrics_url"], list(r["services"])) for r in rows]


__all__ = ["discover", "heartbeat", "register", "unregister"]
