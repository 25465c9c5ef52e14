"""``agentstream session …``: conversations — list them, show one's transcript, delete one
(streams/client/sessions.py). A turn is submitted with ``agentstream submit --session ID``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from agentstream.cli.common import console, err, run_async, short

app = typer.Typer(help="Conversations (sessions): list them, show one's transcript, delete one.",
                  no_args_is_help=True)


@app.command("list")
def session_list(
    limit: int = typer.Option(50, "--limit", help="The N most recently updated sessions."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
) -> None:
    """Sessions, the most recently updated first: turns kept, turns dropped for the budget, tokens."""
    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.store.sessions import SessionRow

    async def go() -> Sequence[SessionRow]:
        async with AgentClient() as client:
            return await client.sessions.list(limit=limit)

    rows = run_async(go())
    if as_json:
        print(json.dumps([_summary(r) for r in rows]))
        return
    if not rows:
        console.print("no sessions")
        return
    table = Table("session", "turns", "dropped", "tokens (est.)", "updated (UTC)", "last run")
    for r in rows:
        table.add_row(escape(r.session_id), str(len(r.turns)), str(r.dropped), str(r.tokens),
                      r.updated_at.strftime("%Y-%m-%d %H:%M:%S"), escape(r.last_run_id or ""))
    console.print(table)


@app.command("show")
def session_show(
    session: str = typer.Argument(..., help="The session id."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """The session's transcript (what its next turn starts from) and its turns still going."""
    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.client.sessions import SessionDetails

    async def go() -> SessionDetails | None:
        async with AgentClient() as client:
            return await client.sessions.show(session)

    details = run_async(go())
    if details is None:
        err.print(f"no session {escape(session)!s} (a turn submitted with --session {escape(session)} starts it)")
        raise typer.Exit(1)
    row = details.row
    going = [{"run_id": t.run_id, "status": t.status} for t in details.going]
    if as_json:
        print(json.dumps({**_summary(row), "summary": row.summary, "turns": row.turns, "going": going}))
        return
    console.print(f"session [bold]{escape(row.session_id)}[/bold]: {len(row.turns)} turn(s), {row.dropped} dropped "
                  f"or summarised for the token budget, ~{row.tokens} tokens")
    if row.summary:
        console.print(f"  [bold]summary[/bold] {escape(short(row.summary, 600))}")
    for i, turn in enumerate(row.turns, 1):
        console.print(f"[dim]{i}. {escape(turn['run_id'])}[/dim]")
        console.print(f"  [bold]user[/bold]  {escape(short(turn['user'], 300))}")
        console.print(f"  [bold]agent[/bold] {escape(short(turn['answer'], 300))}")
    for ref in details.going:
        console.print(f"[dim]{escape(ref.run_id)}: {ref.status}[/dim]")


@app.command("delete")
def session_delete(session: str = typer.Argument(..., help="The session id.")) -> None:
    """Erase the transcript (PostgreSQL), tombstone it on agent.sessions, and stop the session's turns that
    have not ended (they fail with session_deleted). The id may be used again: a new, empty session.
    On the local secure stack this runs as the approver login (a tenant's own with AGENTSTREAM_TENANT),
    the one ``agentstream_delete_session`` is granted to (migration 0018)."""
    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    async def go() -> list[str] | None:
        async with AgentClient(Settings.load(identity=Identity(database_login="approver"))) as client:
            return await client.sessions.delete(session)

    stopped = run_async(go())
    if stopped is None:
        err.print(f"no session {escape(session)}")
        raise typer.Exit(1)
    console.print(f"session {escape(session)} deleted" + (f"; stopping {', '.join(stopped)}" if stopped else ""))


def _summary(row: Any) -> dict[str, Any]:
    return {"session": row.session_id, "epoch": row.epoch, "turns": len(row.turns), "dropped": row.dropped,
            "tokens": row.tokens, "created_at": row.created_at.isoformat(), "updated_at": row.updated_at.isoformat(),
            "last_run_id": row.last_run_id}
