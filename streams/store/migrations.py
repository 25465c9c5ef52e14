"""Versioned SQL migrations from ``infra/postgres/migrations/NNNN_name.sql``.

Each file is applied once, in version order, inside its own transaction, and recorded in
``agentstream_migrations`` with a checksum. Applying is idempotent and safe to run from several
processes at once (a transaction-level advisory lock serialises them). An applied file that was
edited afterwards is an error: write a new migration instead.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from agentstream.streams.core import resources
from agentstream.streams.core.errors import MigrationError

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_KEY = 0x61677374  # "agst": one advisory lock for all migration runners


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path | None = None) -> list[Migration]:
    """The migrations on disk, sorted by version; raise on a malformed or duplicate file name."""
    directory = directory or resources.migrations_dir()
    found: dict[int, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lower_snake.sql")
        version = int(match.group(1))
        if version in found:
            raise MigrationError(f"two migrations have version {version}: {found[version].name}, {path.name}")
        found[version] = Migration(version, match.group(2), path.read_text())
    return [found[v] for v in sorted(found)]


async def apply(conn: asyncpg.Connection, migrations: list[Migration] | None = None) -> list[int]:
    """Apply what is not applied yet; return the versions applied by this call."""
    migrations = discover() if migrations is None else migrations
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        if await conn.fetchval("SELECT to_regclass('agentstream_migrations')") is None:
            # (Only when missing: a service's own login may read the ledger but create nothing.)
            await conn.execute(
            """CREATE TABLE IF NOT EXISTS agentstream_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   checksum   text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
            )
        rows = await conn.fetch("SELECT version, name, checksum FROM agentstream_migrations")
        applied = {r["version"]: r for r in rows}
        done: list[int] = []
        for migration in migrations:
            row = applied.get(migration.version)
            if row is not None:
                if row["checksum"] != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.version:04d}_{migration.name} was changed after it was "
                        "applied; add a new migration instead of editing an applied one"
                    )
                continue
            try:
                await conn.execute(migration.sql)
            except asyncpg.InsufficientPrivilegeError as exc:
                raise MigrationError(f"migration {migration.version:04d}_{migration.name} is not applied and this "
                                     f"login may not apply it ({exc}): run `agentstream migrate` as the schema's "
                                     "owner first") from exc
            except asyncpg.PostgresError as exc:
                raise MigrationError(f"migration {migration.version:04d}_{migration.name} failed: {exc}") from exc
            await conn.execute(
                "INSERT INTO agentstream_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                migration.version, migration.name, migration.checksum,
            )
            done.append(migration.version)
    return done


async def migrate(database_url: str) -> list[int]:
    """Connect, apply pending migrations, disconnect."""
    conn = await asyncpg.connect(database_url)
    try:
        return await apply(conn)
    finally:
        await conn.close()
