"""``agentstream token …``: the HTTP gateway's bearer tokens — create one (shown once), list, revoke
(services/gateway/tokens.py; docs/gateway.md, "Auth"). Runs as the schema's owner: on a secure stack the
gateway's own login may read tokens, never make them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from agentstream.cli.common import console, err, run_async

if TYPE_CHECKING:
    from agentstream.streams.config.settings import Settings

app = typer.Typer(help="The HTTP gateway's bearer tokens: create (shown once), list, revoke.", no_args_is_help=True)


def _settings() -> Settings:
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    return Settings.load(identity=Identity(principal="admin"))  # the schema's owner writes gateway_tokens


@app.command("create")
def token_create(
    tenant: str = typer.Option(..., "--tenant", help="The tenant the token acts for (its cell: topic prefix "
                                                     "TENANT.; the gateway's default tenant is its own prefix)."),
    role: str = typer.Option(..., "--role", help="submitter (submit, cancel, read), approver (approve/deny, "
                                                 "read), operator (dead letters: browse, re-drive; read) or "
                                                 "reader (read)."),
    name: str = typer.Option("", "--name", help="What it is for; recorded as the approver of its decisions."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (with the token)."),
) -> None:
    """Make a token and print it — the only time it is shown (only its hash is stored)."""
    import asyncpg

    from agentstream.services.gateway.settings import tenant_name_ok
    from agentstream.services.gateway.tokens import Role, create

    if not tenant_name_ok(tenant):
        err.print(f"[red]error:[/red] tenant {escape(tenant)!r}: lower-case letters, digits and '-' only")
        raise typer.Exit(2)
    try:
        chosen = Role(role)
    except ValueError:
        err.print(f"[red]error:[/red] role {escape(role)!r}: submitter, approver, operator or reader")
        raise typer.Exit(2) from None

    async def go():
        from agentstream.streams.store import migrations

        url = _settings().database_url
        await migrations.migrate(url)  # the tokens' table (0019) may predate every worker's start
        conn = await asyncpg.connect(url)
        try:
            return await create(conn, tenant=tenant, role=chosen, name=name)
        finally:
            await conn.close()

    token, row = run_async(go())
    if as_json:
        print(json.dumps({"token": token, "token_id": row.token_id, "tenant": row.tenant, "role": row.role.value,
                          "name": row.name}))
        return
    console.print(f"token {row.token_id} for tenant {escape(row.tenant)}, role {row.role.value} (shown once; "
                  "keep it secret):")
    print(token)


@app.command("list")
def token_list(
    tenant: str = typer.Option(None, "--tenant", help="Only this tenant's tokens."),
    revoked: bool = typer.Option(False, "--revoked", help="Include revoked tokens."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
) -> None:
    """Tokens (never their secrets): id, tenant, role, name, when made, when revoked."""
    import asyncpg

    from agentstream.services.gateway.tokens import listing

    async def go():
        conn = await asyncpg.connect(_settings().database_url)
        try:
            return await listing(conn, tenant=tenant, revoked=revoked)
        finally:
            await conn.close()

    rows = run_async(go())
    if as_json:
        print(json.dumps([{"token_id": r.token_id, "tenant": r.tenant, "role": r.role.value, "name": r.name,
                           "created_at": r.created_at.isoformat(),
                           "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None} for r in rows]))
        return
    if not rows:
        console.print("no tokens")
        return
    table = Table("token id", "tenant", "role", "name", "created (UTC)", "revoked (UTC)")
    for r in rows:
        table.add_row(r.token_id, escape(r.tenant), r.role.value, escape(r.name),
                      r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                      r.revoked_at.strftime("%Y-%m-%d %H:%M:%S") if r.revoked_at else "")
    console.print(table)


@app.command("revoke")
def token_revoke(token_id: str = typer.Argument(..., help="The token's id (or the token itself).")) -> None:
    """Revoke a token: every gateway replica refuses it within AGENTSTREAM_GATEWAY_AUTH_CACHE_S (30 s)."""
    import asyncpg

    from agentstream.services.gateway.tokens import revoke

    async def go() -> bool:
        conn = await asyncpg.connect(_settings().database_url)
        try:
            return await revoke(conn, token_id)
        finally:
            await conn.close()

    if not run_async(go()):
        err.print(f"[red]error:[/red] no token {escape(token_id)!r} that is not revoked already")
        raise typer.Exit(1)
    console.print(f"revoked {escape(token_id)}")
