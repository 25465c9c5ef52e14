"""PostgreSQL 18 with pgvector: connections, migrations, and an HNSW index that finds true neighbours."""

from __future__ import annotations

import uuid

import asyncpg
import numpy as np
import pytest

from agentstream.streams.core.errors import MigrationError
from agentstream.streams.store import db, migrations


async def test_connects_with_pgvector(database_url):
    conn = await db.connect(database_url)
    try:
        assert (await conn.fetchval("SHOW server_version")).startswith("18")
        assert await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert await conn.fetchval("SELECT '[1,2,3]'::vector <-> '[1,2,4]'::vector") == pytest.approx(1.0)
    finally:
        await conn.close()


async def test_hnsw_index_returns_true_nearest_neighbours(database_url):
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(2000, 32)).astype(np.float32)
    queries = rng.normal(size=(20, 32)).astype(np.float32)
    table = f"hnsw_{uuid.uuid4().hex[:8]}"
    conn = await db.connect(database_url)
    try:
        await conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, embedding vector(32) NOT NULL)")
        await conn.copy_records_to_table(table, records=[(i, v) for i, v in enumerate(vectors)])
        await conn.execute(f"CREATE INDEX ON {table} USING hnsw (embedding vector_l2_ops) "
                           "WITH (m = 16, ef_construction = 200)")
        await conn.execute("SET hnsw.ef_search = 200")
        await conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(
            f"EXPLAIN SELECT id FROM {table} ORDER BY embedding <-> $1 LIMIT 10", queries[0]))
        assert "hnsw" in plan.lower() or f"{table}_embedding_idx" in plan, plan
        for query in queries:
            got = [r["id"] for r in await conn.fetch(
                f"SELECT id FROM {table} ORDER BY embedding <-> $1 LIMIT 10", query)]
            exact = np.argsort(np.linalg.norm(vectors - query, axis=1))[:10].tolist()
            assert got == exact
    finally:
        await conn.execute(f"DROP TABLE IF EXISTS {table}")
        await conn.close()


async def test_migrations_are_idempotent_and_guard_edits(database_url, tmp_path):
    conn = await asyncpg.connect(database_url)
    schema = f"mig_{uuid.uuid4().hex[:8]}"
    try:
        # The session's database was migrated by the fixture: nothing left to apply.
        assert await migrations.apply(conn) == []
        versions = [m.version for m in migrations.discover()]
        recorded = [r["version"] for r in await conn.fetch("SELECT version FROM agentstream_migrations ORDER BY 1")]
        assert recorded == versions

        # A private schema with its own migrations table: apply twice, then edit an applied file.
        await conn.execute(f"CREATE SCHEMA {schema}")
        await conn.execute(f"SET search_path TO {schema}")
        (tmp_path / "0001_things.sql").write_text("CREATE TABLE things (id int PRIMARY KEY);")
        (tmp_path / "0002_more.sql").write_text("ALTER TABLE things ADD COLUMN name text;")
        assert await migrations.apply(conn, migrations.discover(tmp_path)) == [1, 2]
        assert await migrations.apply(conn, migrations.discover(tmp_path)) == []
        (tmp_path / "0002_more.sql").write_text("ALTER TABLE things ADD COLUMN label text;")
        with pytest.raises(MigrationError, match="changed after it was applied"):
            await migrations.apply(conn, migrations.discover(tmp_path))

        (tmp_path / "0002_more.sql").write_text("ALTER TABLE things ADD COLUMN name text;")
        (tmp_path / "0003_broken.sql").write_text("ALTER TABLE nothing ADD COLUMN x int;")
        with pytest.raises(MigrationError, match="0003_broken failed"):
            await migrations.apply(conn, migrations.discover(tmp_path))
        assert await conn.fetchval("SELECT max(version) FROM agentstream_migrations") == 2
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()
