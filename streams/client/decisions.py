"""Approvals in PostgreSQL, for the client: recording a person's decision on a tool call (the functions
of migrations 0015 and 0021) and listing the calls that wait for one. ``AgentClient.approve``/``deny``/
``awaiting_approval`` publish and wrap these; they raise what the database says, turned into the
client's errors (``NotAnApprover``, ``NotAwaitingApproval``)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from typing import Any

import asyncpg

from agentstream.streams.core.approvals import NOT_AWAITING_APPROVAL, Decision
from agentstream.streams.core.errors import NotAnApprover, NotAwaitingApproval


async def record(pool: asyncpg.Pool, asked: Decision, login: str, *, as_by: bool = False) -> Decision:
    """``agentstream_decide``: the decision recorded on the step, by this call or an earlier one.
    ``as_by``: ``agentstream_decide_as``, recording ``asked.decided_by``, first (the gateway's login)."""
    try:
        row = None
        if as_by:
            with contextlib.suppress(asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedFunctionError):
                row = await pool.fetchrow("SELECT * FROM agentstream_decide_as($1, $2, $3, $4, $5)", asked.run_id,
                                          asked.step_id, asked.asked, asked.reason, asked.decided_by)
        if row is None:  # not the gateway's login: recorded under the login
            row = await pool.fetchrow("SELECT * FROM agentstream_decide($1, $2, $3, $4)",
                                      asked.run_id, asked.step_id, asked.asked, asked.reason)
    except asyncpg.InsufficientPrivilegeError:
        row = None  # not granted the function: not an approver
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != NOT_AWAITING_APPROVAL:
            raise
        raise NotAwaitingApproval(f"{exc.message}: nothing was recorded "
                                  "(`agentstream approvals` lists the calls waiting)") from None
    if row is None:
        raise NotAnApprover(f"the database login {login!r} may not decide on this tool call: an approver's "
                            "login (a member of agentstream_approver, or a tenant's approver for its own "
                            "runs) records decisions")
    # decided_now: migration 0015; before it the function did not say (guessed from who decided).
    now = row["decided_now"] if "decided_now" in row.keys() else str(row["decided_by"]) == login
    return replace(asked, approved=bool(row["approved"]), reason=str(row["reason"]),
                   decided_by=str(row["decided_by"]), decided_at=row.get("decided_at"), recorded=True,
                   earlier=not now)


async def awaiting(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    """Tool calls waiting for a person's approval: run id, step id, tool, arguments, since when. A run
    paused on its tool call has one; a run whose parallel calls fan out (pending kind ``tools``) may
    have several, and may be running its other calls meanwhile."""
    rows = await pool.fetch(
        """SELECT run_id, state->>'pending_step_id' AS step_id, state->>'pending_kind' AS kind,
                  state->'pending_request' AS request, updated_at FROM runs
           WHERE status = 'awaiting_approval' OR (status = 'running' AND state->>'pending_kind' = 'tools')
           ORDER BY updated_at""")
    waiting: list[dict[str, Any]] = []
    for r in rows:
        request = json.loads(r["request"])
        calls = ([c for c in request.get("calls", ()) if c.get("awaiting_approval")] if r["kind"] == "tools"
                 else [{**request, "step_id": r["step_id"]}])
        waiting.extend({"run_id": r["run_id"], "step_id": c["step_id"], "since": r["updated_at"],
                        **{k: v for k, v in c.items() if k in ("tool", "arguments")}} for c in calls)
    return waiting


__all__ = ["awaiting", "record"]
