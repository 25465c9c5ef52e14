"""Bearer tokens: made, listed, revoked (``agentstream token``) and verified (the gateway), in PostgreSQL.

A token is ``ags_<token_id>_<secret>``: ``token_id`` (12 hex characters) names it in lists and logs, the
secret (32 random bytes, URL-safe base64) is what proves it. Only the SHA-256 of the secret is stored
(migration 0019): the token is shown once, when it is made, and a leaked table opens nothing. A plain
hash rather than a slow password hash because the secret is random and long (256 bits; no dictionary to
try), and a verification must cost microseconds on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TypeAlias

import asyncpg

#: An asyncpg pool or connection (the gateway has a pool, the CLI a connection).
Database: TypeAlias = "asyncpg.Pool | asyncpg.Connection"

PREFIX = "ags_"
_ID_CHARS = 12


class Role(StrEnum):
    """What a token may do: a ``reader`` reads (GET); an ``approver`` also decides on tool calls waiting
    for a person; a ``submitter`` also submits and cancels runs and deletes sessions; an ``operator`` also
    browses and re-drives its tenant's dead letters. Approving is not a submitter's right (who asks for a
    refund should not approve it), and neither is the operator's: re-driving a record is repairing the
    pipeline, not taking part in a run (docs/gateway.md, "Auth")."""

    READER = "reader"
    APPROVER = "approver"
    SUBMITTER = "submitter"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: the token's tenant, role and id (never anything the request says)."""

    tenant: str
    role: Role
    token_id: str
    name: str = ""

    @property
    def approver_name(self) -> str:
        """The decider an approval through the gateway records: the token, not a name in the body."""
        return f"gateway:{self.tenant}:{self.name or self.token_id}"

    def may(self, needed: Role) -> bool:
        if needed is Role.READER:
            return True
        return self.role is needed


@dataclass(frozen=True)
class TokenRow:
    """A token as ``agentstream token list`` shows it (never its secret)."""

    token_id: str
    tenant: str
    role: Role
    name: str
    created_at: datetime
    revoked_at: datetime | None


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token() -> tuple[str, str, str]:
    """(the token to show once, its id, the digest to store)."""
    token_id = secrets.token_hex(_ID_CHARS // 2)
    secret = secrets.token_urlsafe(32)
    return f"{PREFIX}{token_id}_{secret}", token_id, digest(secret)


def split(token: str) -> tuple[str, str] | None:
    """(token id, secret) of a well-formed token; None otherwise (it is then simply not a token)."""
    if not token.startswith(PREFIX) or len(token) < len(PREFIX) + _ID_CHARS + 2 or len(token) > 200:
        return None
    token_id, sep, secret = token[len(PREFIX):].partition("_")
    if not sep or len(token_id) != _ID_CHARS or not secret or any(c not in "0123456789abcdef" for c in token_id):
        return None
    return token_id, secret


async def create(db: Database, *, tenant: str, role: Role, name: str = "") -> tuple[str, TokenRow]:
    """Make a token; return it (the only time it is seen) and its row."""
    token, token_id, hashed = new_token()
    row = await db.fetchrow(
        """INSERT INTO gateway_tokens (token_id, secret_sha256, tenant, role, name) VALUES ($1, $2, $3, $4, $5)
           RETURNING token_id, tenant, role, name, created_at, revoked_at""", token_id, hashed, tenant, role.value, name)
    return token, _row(row)


async def listing(db: Database, *, tenant: str | None = None, revoked: bool = False) -> list[TokenRow]:
    rows = await db.fetch(
        """SELECT token_id, tenant, role, name, created_at, revoked_at FROM gateway_tokens
           WHERE ($1::text IS NULL OR tenant = $1) AND ($2 OR revoked_at IS NULL) ORDER BY tenant, created_at""",
        tenant, revoked)
    return [_row(r) for r in rows]


async def revoke(db: Database, token_id: str) -> bool:
    """Revoke a token (by its id, or the whole token); False when there is no such token not yet revoked."""
    parts = split(token_id)
    status = await db.execute("UPDATE gateway_tokens SET revoked_at = now() WHERE token_id = $1 AND revoked_at IS NULL",
                              parts[0] if parts else token_id)
    return status.endswith(" 1")


async def verify(db: Database, token: str) -> Principal | None:
    """The principal of a valid, unrevoked token; None for anything else."""
    parts = split(token)
    if parts is None:
        return None
    token_id, secret = parts
    row = await db.fetchrow("SELECT tenant, role, name, secret_sha256 FROM gateway_tokens "
                            "WHERE token_id = $1 AND revoked_at IS NULL", token_id)
    if row is None or not hmac.compare_digest(str(row["secret_sha256"]), digest(secret)):
        return None
    return Principal(tenant=row["tenant"], role=Role(row["role"]), token_id=token_id, name=row["name"])


def _row(row: asyncpg.Record | None) -> TokenRow:
    assert row is not None
    return TokenRow(token_id=row["token_id"], tenant=row["tenant"], role=Role(row["role"]), name=row["name"],
                    created_at=row["created_at"], revoked_at=row["revoked_at"])


__all__ = ["PREFIX", "Principal", "Role", "TokenRow", "create", "digest", "listing", "new_token", "revoke",
           "split", "verify"]
