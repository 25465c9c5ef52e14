"""``agentstream agent …``: named, versioned agent definitions — register them (from a Python module of
``Agent`` objects or a YAML file), list them, show one (streams/client/agents.py; docs/agents.md). A task
runs one with ``agentstream submit --agent NAME[@VERSION]``."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from agentstream.cli.common import console, run_async, short

app = typer.Typer(help="Agent definitions: register them (a module or a YAML file), list them, show one.",
                  no_args_is_help=True)


@app.command("register")
def agent_register(
    targets: list[str] = typer.Argument(..., metavar="MODULE|FILE.yaml...",
                                        help="A module of Agent objects (mypkg.agents, importable from here) or a "
                                             "YAML file of definitions; several are registered as one batch."),
    by: str = typer.Option("", "--by", help="Who registers (recorded; default: this host and process)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
) -> None:
    """Register agent definitions on agent.agents: all of them or, when one is refused (an unknown tool or
    agent, a cycle of calls, a changed definition under a registered version, a lower version), none."""
    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.client.agents import load

    if os.getcwd() not in sys.path:  # as `python -m` would: a module of the project the command runs in
        sys.path.insert(0, os.getcwd())
    agents = [agent for target in targets for agent in load(target)]

    async def go() -> list[tuple[Any, str]]:
        async with AgentClient() as client:
            return list(await client.agents.register(*agents, by=by))

    result = run_async(go())
    if as_json:
        print(json.dumps([{"agent": a.ref, "digest": a.digest, "registered": judgement != "same",
                           "judgement": judgement} for a, judgement in result]))
        return
    for agent, judgement in result:
        what = "already registered, unchanged" if judgement == "same" else "registered"
        console.print(f"{escape(agent.ref)}  {what}  [dim]digest {agent.digest}[/dim]")


@app.command("list")
def agent_list(as_json: bool = typer.Option(False, "--json", help="Print one JSON array.")) -> None:
    """Every registered agent: its latest version, its other versions, what it is for."""
    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.core.agents import Agent

    async def go() -> dict[str, dict[int, Agent]]:
        async with AgentClient() as client:
            return await client.agents.list()

    agents = run_async(go())
    rows = [(name, sorted(versions), versions[max(versions)]) for name, versions in sorted(agents.items())]
    if as_json:
        print(json.dumps([{"name": name, "latest": latest.version, "versions": numbers, "digest": latest.digest,
                           "description": latest.description, "tools": list(latest.tools),
                           "calls": list(latest.calls), "handoffs": list(latest.handoffs)}
                          for name, numbers, latest in rows]))
        return
    if not rows:
        console.print("no agents (agentstream agent register MODULE|FILE.yaml registers some)")
        return
    table = Table("agent", "latest", "versions", "tools", "calls / hands off to", "description")
    for name, numbers, latest in rows:
        refs = ", ".join(latest.calls) + (" / " + ", ".join(latest.handoffs) if latest.handoffs else "")
        table.add_row(escape(name), str(latest.version), ", ".join(map(str, numbers)), escape(", ".join(latest.tools)),
                      escape(refs), escape(short(latest.description, 60)))
    console.print(table)


@app.command("show")
def agent_show(
    ref: str = typer.Argument(..., metavar="NAME[@VERSION]", help="The agent (its latest version) or one version."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """One definition: every field that is not at its default, its digest and the agent's versions."""
    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.core.agents import Agent

    async def go() -> tuple[Agent, list[int]]:
        async with AgentClient() as client:
            agent = await client.agents.show(ref)
            return agent, sorted((await client.agents.list()).get(agent.name, {}))

    agent, versions = run_async(go())
    body = {"name": agent.name, "version": agent.version, "digest": agent.digest, "versions": versions,
            **agent.definition()}
    if as_json:
        print(json.dumps(body))
        return
    console.print(f"agent [bold]{escape(agent.ref)}[/bold]  [dim]digest {agent.digest}; versions "
                  f"{', '.join(map(str, versions))}[/dim]")
    for key, value in agent.definition().items():
        text = value if isinstance(value, str) else json.dumps(value)
        console.print(f"  [bold]{key}[/bold]  {escape(short(text, 300))}")
