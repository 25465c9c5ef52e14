"""``agentstream approve``, ``deny`` and ``approvals``: decisions on tool calls that wait for a person.

Registered on the main app by agentstream/cli/__init__.py. What ``approve``/``deny`` print is
the decision that holds for the step, not the one asked for: the first decision on a step stands
(``agentstream_decide``), so a deny after an approval leaves the tool to run, and saying "denied" then
would be a lie an operator acts on. Exit status:

- 0: the step's decision is the one asked for — recorded by this call, or an equal earlier decision
  (a retry is harmless); with ``AGENTSTREAM_APPROVALS=open``: announced (nothing is recorded to check);
- 1: nothing was decided — not an approver, the run does not wait at that step, the database is down;
- 3: an earlier, different decision stands; the one asked for was not recorded.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from agentstream.cli.common import console, err
from agentstream.streams.core.approvals import Decision
from agentstream.streams.core.errors import AgentStreamError

#: Exit status when an earlier, different decision stands (see the module docstring).
EXIT_EARLIER_STANDS = 3
#: The local secure stack's login for the operator's reader (every cell's runs; docs/security.md).
OPERATOR_READER = "operator-reader"


def approve(run_id: str, step_id: str, reason: str = typer.Option("", help="Recorded with the decision."),
            by: str = typer.Option("", help="Who decided (with AGENTSTREAM_APPROVALS=recorded: the database "
                                            "login, whatever this says)."),
            as_json: bool = typer.Option(False, "--json", help="Print the decision that holds as JSON.")) -> None:
    """Let a tool call that waits for approval run (see `agentstream approvals`). Prints the decision that
    holds; exit 3 when an earlier denial stands."""
    _decide(run_id, step_id, True, reason, by, as_json)


def deny(run_id: str, step_id: str, reason: str = typer.Option("", help="Told to the model."),
         by: str = typer.Option("", help="Who decided (as for approve)."),
         as_json: bool = typer.Option(False, "--json", help="Print the decision that holds as JSON.")) -> None:
    """Refuse a tool call that waits for approval; the model is told why. Prints the decision that holds;
    exit 3 when an earlier approval stands (the tool runs)."""
    _decide(run_id, step_id, False, reason, by, as_json)


def approvals(as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
              operator: bool = typer.Option(False, "--operator", help="Read as the operator's reader: every "
                                                                      "cell's waiting calls (local secure stack).")
              ) -> None:
    """Tool calls waiting for a person's approval (this login's cell; --operator: every cell's)."""
    import asyncio

    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    identity = Identity(database_login=OPERATOR_READER) if operator else Identity()

    async def go() -> list[dict]:
        async with AgentClient(Settings.load(identity=identity)) as client:
            return await client.awaiting_approval()

    waiting = asyncio.run(go())
    if as_json:
        print(json.dumps(waiting, default=str))
        return
    table = Table("run", "step", "tool", "arguments", "waiting since")
    for w in waiting:
        table.add_row(w["run_id"], w["step_id"], w.get("tool", ""), json.dumps(w.get("arguments", {})),
                      str(w["since"]))
    console.print(table if waiting else "no tool call is waiting for approval")


def _decide(run_id: str, step_id: str, approved: bool, reason: str, by: str, as_json: bool) -> None:
    import asyncio

    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    # On the local secure stack: its approver login (docs/security.md).
    identity = Identity(database_login="approver")

    async def go() -> Decision:
        async with AgentClient(Settings.load(identity=identity)) as client:
            return await (client.approve if approved else client.deny)(run_id, step_id, reason, by)

    try:
        decision = asyncio.run(go())
    except AgentStreamError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    text, status = describe(decision)
    if as_json:
        print(json.dumps(decision_json(decision)))
    else:
        console.print(text, style="red" if status else None, markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(status)


def describe(decision: Decision) -> tuple[str, int]:
    """One line saying what holds for the step (plain text, no markup), and the exit status."""
    asked = "approve" if decision.asked else "deny"
    done = "approved" if decision.approved else "denied"
    where = f"{decision.run_id} {decision.step_id}"
    if not decision.recorded:
        return (f"{asked} announced: {where} (AGENTSTREAM_APPROVALS=open: nothing is recorded, so whether it "
                "counts cannot be known here; the planner takes the first decision it reads while the run "
                f"waits at this step and ignores later ones; `agentstream status {decision.run_id}` shows what "
                "happened)", 0)
    who = f"by {decision.decided_by}" + (f" at {decision.decided_at.isoformat(timespec='seconds')}"
                                         if decision.decided_at else "")
    why = f", reason: {decision.reason!r}" if decision.reason else ""
    if not decision.earlier:
        return f"{done}: {where} (recorded {who}{why})", 0
    if decision.as_asked:
        return (f"already {done}: {where} (an earlier decision stands, {who}{why}; this one was not "
                "recorded)", 0)
    effect = "the tool call goes ahead" if decision.approved else "the tool call does not run"
    return (f"not {'approved' if decision.asked else 'denied'}: {where} was {done} {who}{why}, and that earlier "
            f"decision stands (the first decision on a step is final): {effect}", EXIT_EARLIER_STANDS)


def decision_json(decision: Decision) -> dict[str, Any]:
    """The decision as ``--json`` prints it (with ``as_asked``)."""
    data = dataclasses.asdict(decision)
    data["decided_at"] = decision.decided_at.isoformat() if decision.decided_at else None
    data["as_asked"] = decision.as_asked
    return data
