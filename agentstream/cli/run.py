"""``agentstream submit``, ``cancel`` and ``status``: a client's commands on runs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table

from agentstream.cli.approvals import OPERATOR_READER
from agentstream.cli.common import console, err, short


def submit(
    task: str = typer.Argument(..., help="What the agent should do."),
    tools: str = typer.Option(None, help="Comma-separated tools the run may call (default: all registered)."),
    max_steps: int = typer.Option(None, help="Most steps (model, tool and retrieval) the run may take (default 8; "
                                             "with --agent, the agent's)."),
    deadline: float = typer.Option(None, help="Seconds from now after which the run fails."),
    wait: bool = typer.Option(False, "--wait", help="Wait for the outcome and print it."),
    follow: bool = typer.Option(False, "--follow", help="Print the model's tokens as they are generated."),
    timeout: float = typer.Option(300.0, help="Seconds --wait waits."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    output_schema: str = typer.Option(None, "--output-schema", metavar="FILE|JSON",
                                      help="A JSON Schema the answer must match (a file, or the JSON itself); "
                                           "the outcome's output is then that JSON."),
    max_tokens: int = typer.Option(None, help="Most tokens per model step (default: AGENTSTREAM_MODEL_MAX_TOKENS, "
                                              "256)."),
    temperature: float = typer.Option(None, help="Sampling temperature, 0 to 2 (default 0)."),
    top_p: float = typer.Option(None, help="Nucleus sampling, above 0 and at most 1 (default: the engine's)."),
    stop: list[str] = typer.Option(None, help="A string that ends a model step's output (repeat for up to 4)."),
    seed: int = typer.Option(None, help="Sampling seed (default: the engine's)."),
    session: str = typer.Option(None, "--session", help="Make the task a turn of this conversation (new if unknown): "
                                                        "it sees the session's earlier turns and runs after them."),
    tool_calling: str = typer.Option(None, "--tool-calling", metavar="native|json",
                                     help="How the model calls tools: json actions, or the engine's native tool "
                                          "calling (default: AGENTSTREAM_TOOL_CALLING, json)."),
    agent: str = typer.Option(None, "--agent", metavar="NAME[@VERSION]",
                              help="Run a registered agent (`agentstream agent list`): its tools, prompt, settings "
                                   "and limits; the task adds its text, deadline and session."),
) -> None:
    """Publish a task to agent.tasks (refused with a clear message if it is invalid)."""
    import asyncio

    from agentstream.streams.client.agent_client import AgentClient

    schema = _schema_option(output_schema)

    async def go() -> dict:
        async with AgentClient() as client:
            run_id = await client.submit(task, tools=tools.split(",") if tools else None, max_steps=max_steps,
                                         deadline=deadline, output_schema=schema, max_tokens=max_tokens,
                                         temperature=temperature, top_p=top_p, stop=stop or None, seed=seed,
                                         session=session, tool_calling=tool_calling, agent=agent)
            if follow:
                console.print(f"run [bold]{run_id}[/bold]")
                step = None
                async for token in client.stream(run_id):
                    if token.step_id != step:
                        step = token.step_id
                        console.print(f"\n[dim]{step}[/dim] ", end="")
                    console.print(token.text, end="", markup=False, highlight=False)
                console.print()
            if not (wait or follow):
                return {"run_id": run_id}
            result = await client.wait(run_id, timeout=timeout)
            return {"run_id": run_id, "status": result.status, "answer": result.answer, "output": result.output,
                    "error_code": result.error_code, "error": result.error, "steps": result.steps,
                    "duration_ms": round(result.duration_ms, 1), "_status": await client.status(run_id)}

    out = asyncio.run(go())
    details = out.pop("_status", None)
    if as_json:
        print(json.dumps(out))
    else:
        if not follow:
            console.print(f"run [bold]{out['run_id']}[/bold]")
        if details:
            print_run(details)
    if (wait or follow) and out.get("status") != "completed":
        raise typer.Exit(1)


def _schema_option(value: str | None) -> str | None:
    """``--output-schema``: the text of a file of that name, else the value itself, which must then be JSON
    (whether it is valid JSON Schema is the task rules' to say, as for any client)."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_file():
        return path.read_text()
    if not value.lstrip().startswith("{"):
        raise typer.BadParameter(f"no file {value!r}, and not a JSON object", param_hint="--output-schema")
    return value


def cancel(run_id: str, reason: str = typer.Option("", help="Why (recorded with the run).")) -> None:
    """Stop a run: it fails with error_code 'cancelled' and a generation in progress is aborted."""
    import asyncio

    from agentstream.streams.client.agent_client import AgentClient

    async def go() -> None:
        async with AgentClient() as client:
            await client.cancel(run_id, reason)

    asyncio.run(go())
    console.print(f"cancellation of {run_id} requested")


def status(run_id: str, as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
           operator: bool = typer.Option(False, "--operator", help="Read as the operator's reader: any cell's "
                                                                   "run (local secure stack; docs/security.md).")
           ) -> None:
    """A run's status and steps (from PostgreSQL; a client's login sees its own cell's runs only)."""
    import asyncio

    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    identity = Identity(database_login=OPERATOR_READER) if operator else Identity()

    async def go() -> Mapping[str, Any] | None:
        async with AgentClient(Settings.load(identity=identity)) as client:
            found = await client.status(run_id)
            return await _with_children(client, found) if found is not None else None

    details = asyncio.run(go())
    if details is None:
        err.print(f"[red]error:[/red] no run {escape(run_id)}" + ("" if operator else " that this login may read "
                                                                  "(--operator: any cell's)"), soft_wrap=True)
        raise typer.Exit(2)
    if as_json:
        print(json.dumps(details, default=str))
    else:
        print_run(details)


async def _with_children(client: Any, details: Mapping[str, Any]) -> dict[str, Any]:
    """``details`` with ``children``: the status of each sub-agent run its steps started (step index →
    the child's details, with its own children: a tree of agents, services/planner/subagents.py)."""
    children = {}
    for step in details["steps"]:
        request = step["request"] if isinstance(step["request"], Mapping) else {}
        child = await client.status(request["child_run_id"]) if request.get("child_run_id") else None
        if child is not None:
            children[step["step_index"]] = await _with_children(client, child)
    return {**details, "children": children}


def print_run(details: Mapping[str, Any], depth: int = 0) -> None:
    """The run's steps as a table, then its answer or error, and under each sub-agent call its child's."""
    table = Table("#", "kind", "status", "request", "result", "ms", title=f"{details['run_id']} · {details['status']}")
    for step in details["steps"]:
        ms = ""
        if step["completed_at"] and step["requested_at"]:
            ms = f"{(step['completed_at'] - step['requested_at']).total_seconds() * 1000:.0f}"
        table.add_row(str(step["step_index"]), step["kind"], step["status"], short(step["request"]),
                      short(step["result"] if step["error"] is None else {"error": step["error"]}), ms)
    console.print(Padding(table, (0, 0, 0, 4 * depth)))
    if details["status"] == "completed":
        console.print(Padding(f"[green]answer:[/green] {escape(str(details['answer']))}", (0, 0, 0, 4 * depth)))
    elif details["status"] == "failed":
        console.print(Padding(f"[red]failed ({details['error_code']}):[/red] {escape(str(details['error']))}",
                              (0, 0, 0, 4 * depth)))
    for index, child in (details.get("children") or {}).items():
        console.print(Padding(f"└ step {index} started sub-agent run {child['run_id']}:", (1, 0, 0, 4 * depth)))
        print_run(child, depth + 1)

