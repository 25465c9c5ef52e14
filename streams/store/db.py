"""asyncpg connections with the pgvector codec registered, so vectors travel in binary (COPY too)."""

from __future__ import annotations

import asyncpg
from pgvector.asyncpg import register_vector


async def _init(conn: asyncpg.Connection) -> None:
    await register_vector(conn)


async def connect(database_url: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(database_url)
    await _init(conn)
    return conn


async def _keep(conn: asyncpg.Connection) -> None:
    """No reset on release: our code keeps no session state (no SET, LISTEN or advisory locks on
    pooled connections), and the default reset costs a round trip per query."""


async def create_pool(database_url: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool whose connections all understand ``vector``; the migrations must have run first."""
    return await asyncpg.create_pool(database_url, min_size=min_size, max_size=max_size, init=_init,
                                     reset=_keep)
