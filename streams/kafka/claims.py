"""Claim checks: events too large for a Kafka record travel through PostgreSQL.

Kafka refuses a record larger than the broker's ``message.max.bytes`` (1 MiB by default), and a
producer that meets one fails the handler that produced it — for the same input every time, so the
record it was handling can never finish. An agent makes such events in ordinary use: a long
conversation in a model request or a run snapshot, a tool that returns megabytes.

So when an event's encoding is larger than ``Settings.max_event_bytes``, the runtime stores the encoded
bytes in ``event_payloads`` (keyed by their SHA-256, written before the record is sent) and sends a
``ClaimCheck`` instead: the same event id, run and step, plus the event type, digest and size. The
consumer runtime reads the body back, checks the digest and hands the handler the original event, so
services never see the difference. Clients (which only send tasks, bounded by ``submit``) need no
database for it.

Bodies are content-addressed, so a republished event stores nothing new. They are kept as long as
the topics keep their records (7 days): ``prune`` deletes older ones.
"""

from __future__ import annotations

import hashlib
from datetime import timedelta

import asyncpg

from agentstream.streams.core.errors import ClaimMissing
from agentstream.streams.core.events import ClaimCheck, Event

#: Bodies older than this are deleted by ``prune`` (a day longer than the run topics' retention).
KEEP = timedelta(days=8)


class ClaimStore:
    """``event_payloads`` in PostgreSQL (migration 0008)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def check_in(self, event: Event, body: bytes) -> ClaimCheck:
        """Store ``body`` (the encoded ``event``) and return the claim check that stands in for it."""
        digest = hashlib.sha256(body).hexdigest()
        await self.pool.execute(
            "INSERT INTO event_payloads (digest, body) VALUES ($1, $2) ON CONFLICT (digest) DO NOTHING",
            digest, body)
        return ClaimCheck(event_id=event.event_id, run_id=event.run_id, step_id=event.step_id,
                          parent_step_id=event.parent_step_id, attempt=event.attempt, created_at=event.created_at,
                          producer=event.producer, event_type=type(event).schema_name, digest=digest,
                          size=len(body))

    async def redeem(self, claim: ClaimCheck) -> bytes:
        """The body the claim check stands for; raises ``ClaimMissing`` when it is gone or corrupt."""
        body = await self.pool.fetchval("SELECT body FROM event_payloads WHERE digest = $1", claim.digest)
        if body is None:
            raise ClaimMissing(f"the body of {claim.event_type} {claim.event_id} ({claim.size} bytes, sha256 "
                               f"{claim.digest}) is not in event_payloads")
        if hashlib.sha256(body).hexdigest() != claim.digest:
            raise ClaimMissing(f"the stored body of {claim.event_id} does not match its digest {claim.digest}")
        return bytes(body)

    async def prune(self, keep: timedelta = KEEP) -> int:
        """Delete bodies older than ``keep``; return how many."""
        result = await self.pool.execute("DELETE FROM event_payloads WHERE created_at < now() - $1::interval", keep)
        return int(result.split()[-1])


__all__ = ["KEEP", "ClaimStore"]
