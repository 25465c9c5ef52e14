"""The re-drive bookkeeping in PostgreSQL (``dlq_redrives``, migration 0009): which letters were re-driven,
when, by whom and to where, so that a letter is re-driven once unless forced (``agentstream.streams.dlq``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DeadLetterError
from agentstream.streams.core.events import DeadLetter
from agentstream.streams.dlq.letters import StoredLetter, ValueFrom

log = logging.getLogger(__name__)


class RedriveLog:
    """``dlq_redrives`` for one dead-letter topic, on one connection opened when first needed."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self._conn: asyncpg.Connection | None = None

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    @contextlib.asynccontextmanager
    async def _bookkeeping(self) -> AsyncIterator[asyncpg.Connection]:
        """The connection for ``dlq_redrives``; a database the migrations have not reached is a clear error."""
        if self._conn is None:
            self._conn = await asyncpg.connect(self.settings.database_url)
        try:
            yield self._conn
        except asyncpg.UndefinedTableError:
            raise DeadLetterError("this database has no dlq_redrives table yet: apply the migrations "
                                  "(`agentstream dev up`, or start a worker)") from None
        except asyncpg.InsufficientPrivilegeError:
            # Re-driving is the operator's (migration 0023): a reader's or a tenant's login may not record one.
            login = urlsplit(self.settings.database_url).username or "of this process"
            raise DeadLetterError(f"the database login {login} is refused on the re-drive records (dlq_redrives): "
                                  "re-driving is the operator's (docs/security.md, \"The operator's tools\")") from None

    async def rows(self, stored: StoredLetter) -> list[dict[str, Any]]:
        """The re-drives recorded for this letter, oldest first."""
        if stored.letter is None:
            return []
        async with self._bookkeeping() as conn:
            rows = await conn.fetch(
                """SELECT redriven_at, redriven_by, forced, status, value_from, source_topic, source_partition,
                          target_offset
                   FROM dlq_redrives
                   WHERE dlq_topic = $1 AND dlq_partition = $2 AND dlq_offset = $3 AND letter_event_id = $4
                   ORDER BY id""", stored.topic, stored.partition, stored.offset, stored.letter.event_id)
        return [dict(r) for r in rows]

    async def counts(self, offsets: list[int]) -> dict[int, int] | None:
        """Re-drives per offset of the dead-letter topic; None (logged) when PostgreSQL cannot say."""
        if not offsets:
            return {}
        try:
            async with self._bookkeeping() as conn:
                rows = await conn.fetch(
                    """SELECT dlq_offset, count(*) AS n FROM dlq_redrives
                       WHERE dlq_topic = $1 AND dlq_partition = 0 AND dlq_offset = ANY($2::bigint[])
                       GROUP BY dlq_offset""", self.topic, offsets)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, DeadLetterError) as exc:
            log.warning("re-drive counts unavailable (%s: %s)", type(exc).__name__, exc)
            return None
        return {r["dlq_offset"]: r["n"] for r in rows}

    async def claim(self, stored: StoredLetter, letter: DeadLetter, origin: ValueFrom, force: bool, *,
                    by: str) -> int | None:
        """Record the re-drive before publishing it. The first unforced re-drive of a letter is unique
        (a partial unique index), so two people re-driving at once publish it once; a forced one adds a
        row. None when the letter was claimed by someone else meanwhile."""
        args = (stored.topic, stored.partition, stored.offset, letter.event_id, letter.source_topic,
                letter.source_partition, letter.source_offset, origin, by)
        insert = """INSERT INTO dlq_redrives (dlq_topic, dlq_partition, dlq_offset, letter_event_id, source_topic,
                                              source_partition, source_offset, value_from, redriven_by, forced)
                    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, {forced})"""
        async with self._bookkeeping() as conn:
            claim: int | None = await conn.fetchval(insert.format(forced="false") + """
                ON CONFLICT (dlq_topic, dlq_partition, dlq_offset, letter_event_id) WHERE NOT forced
                DO NOTHING RETURNING id""", *args)
            if claim is None and force:
                claim = await conn.fetchval(insert.format(forced="true") + " RETURNING id", *args)
        return claim

    async def settle(self, claim: int, offset: int | None) -> None:
        """Confirm a claimed re-drive at the copy's offset, or (None: the publish failed) withdraw it."""
        async with self._bookkeeping() as conn:
            if offset is None:
                await conn.execute("DELETE FROM dlq_redrives WHERE id = $1", claim)
            else:
                await conn.execute("UPDATE dlq_redrives SET status = 'published', target_offset = $2 WHERE id = $1",
                                   claim, offset)


def already(row: Mapping[str, Any]) -> str:
    """Why a letter is skipped: the last re-drive recorded for it (``rows``), for a person."""
    when = row["redriven_at"].isoformat(timespec="seconds")
    if row["status"] != "published":
        return (f"a re-drive started at {when} by {row['redriven_by']} did not confirm (it stopped before the "
                f"broker acknowledged?); check {row['source_topic']}[{row['source_partition']}], or --force")
    return (f"already re-driven at {when} to {row['source_topic']}[{row['source_partition']}]@"
            f"{row['target_offset']} (--force re-drives it again)")


__all__ = ["RedriveLog", "already"]
