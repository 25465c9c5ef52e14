"""``agentstream dlq …``: dead letters (agent.dlq): list them, show one, re-drive them (agentstream/ops/dlq.py).
On a secure stack list and show run as the operator's reader, redrive as the operator, and a tenant's
(``AGENTSTREAM_TENANT``) list and show as the tenant, on its own cell (docs/security.md, "The operator's tools")."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer
from rich.markup import escape
from rich.table import Table

from agentstream.cli.common import console, err, run_async, short
from agentstream.streams.config import env
from agentstream.streams.config.identity import CLIENT, Identity
from agentstream.streams.core.errors import ConfigError

if TYPE_CHECKING:
    from agentstream.streams.config.settings import Settings

app = typer.Typer(help="Dead letters (agent.dlq): list them, show one, re-drive them to their source topic. On a "
                       "secure stack list and show read as operator-reader, redrive is the operator's; with "
                       "AGENTSTREAM_TENANT a tenant lists and shows its own cell's (docs/security.md).",
                  no_args_is_help=True)
_KIND_HELP = "Only this error kind: undecodable, unknown_schema, invalid, handler_error, retries_exhausted."


#: Who ``dlq`` is on the local secure stack (docs/security.md, "The operator's tools"): listing and showing
#: letters is the operator's reader's (reads every cell, writes nothing); re-driving is the operator's (the
#: principal that may write the topics a letter came from, the login that records re-drives, migration 0023).
READER = Identity(principal="operator-reader", database_login="operator-reader")
REDRIVER = Identity(principal="operator", database_login="operator")


def identity(*, redrive: bool) -> Identity:
    """The identity of a ``dlq`` command. A process working for a tenant (``AGENTSTREAM_TENANT``) is the
    tenant, its own cell's letters only, and may not re-drive (the operator works on a tenant's cell with
    ``AGENTSTREAM_TOPIC_PREFIX=<tenant>.``)."""
    if env.tenant():
        if redrive:
            raise ConfigError(f"re-driving dead letters is the operator's; as tenant {env.tenant()} use `agentstream "
                              "dlq list` and `dlq show` (the operator re-drives a tenant's letters with "
                              "AGENTSTREAM_TOPIC_PREFIX=<tenant>. and no AGENTSTREAM_TENANT)")
        return CLIENT
    return REDRIVER if redrive else READER


def _operator_settings(*, redrive: bool = False) -> Settings:
    """On a secure stack: ``identity``'s principal and login, never the schema owner's."""
    from agentstream.streams.config.settings import Settings

    try:
        return Settings.load(identity=identity(redrive=redrive))
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None


@app.command("list")
def dlq_list(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
    kind: str = typer.Option(None, "--kind", help=_KIND_HELP),
    source_topic: str = typer.Option(None, "--source-topic", help="Only letters of records from this topic."),
    limit: int = typer.Option(50, "--limit", help="The most recent N matching letters (0: all)."),
) -> None:
    """Dead letters, oldest first: where each record came from, which service gave up on it and why."""

    from agentstream.ops.dlq import DeadLetters, StoredLetter

    async def go() -> list[StoredLetter]:
        async with DeadLetters(_operator_settings()) as letters:
            return await letters.list(kind=kind, source_topic=source_topic, limit=limit or None)

    letters = run_async(go())
    assert isinstance(letters, list)
    if as_json:
        print(json.dumps([s.summary() for s in letters]))
        return
    if not letters:
        console.print("no dead letters" + (" match" if kind or source_topic else ""))
        return
    table = Table("offset", "time (UTC)", "source", "consumer", "kind", "reason", "run", "value", "re-driven")
    for stored in letters:
        letter = stored.letter
        when = stored.timestamp.strftime("%Y-%m-%d %H:%M:%S")
        if letter is None:
            table.add_row(str(stored.offset), when, "", "", "?", escape(short(stored.problem or "", 60)), "", "", "")
            continue
        size = "" if letter.value_size is None else f"{letter.value_size} B" + (" (cut)" if letter.truncated else "")
        table.add_row(str(stored.offset), when, escape(f"{letter.source_topic}[{letter.source_partition}]@"
                                                       f"{letter.source_offset}"),
                      escape(letter.consumer), letter.error_kind, escape(short(letter.reason, 60)),
                      escape(letter.run_id), size, str(stored.redrives or ""))
    console.print(table)


@app.command("show")
def dlq_show(offset: int = typer.Argument(..., help="The letter's offset in the dead-letter topic."),
             as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Everything a letter holds, and the original event decoded when it decodes."""

    from agentstream.ops.dlq import DeadLetters

    async def go() -> dict:
        async with DeadLetters(_operator_settings()) as letters:
            return (await letters.show(offset)).as_dict()

    data = run_async(go())
    assert isinstance(data, dict)
    if as_json:
        print(json.dumps(data, default=str))
        return
    table = Table(show_header=False, box=None)
    skip = {"original", "value_base64", "headers", "redrive_history"}
    for name, value in data.items():
        if name not in skip and value is not None:
            table.add_row(f"[bold]{name}[/bold]", escape(str(value)))
    for name, value in (data.get("headers") or {}).items():
        table.add_row(f"[bold]header[/bold] {escape(name)}", escape(short(value or "", 200)))
    for row in data["redrive_history"]:
        table.add_row("[bold]re-driven[/bold]", escape(f"{row['redriven_at']} by {row['redriven_by']}: {row['status']}"
                                                       f" → {row['source_topic']}[{row['source_partition']}]@"
                                                       f"{row['target_offset']}" + (" (forced)" if row["forced"] else "")))
    console.print(table)
    if data["original"] is not None:
        console.print(f"[bold]original {data['original_type']}[/bold]")
        console.print_json(data=data["original"], default=str)


@app.command("redrive")
def dlq_redrive(
    offsets: list[int] = typer.Argument(None, help="Offsets of the letters to re-drive."),
    every: bool = typer.Option(False, "--all", help="Every letter (narrowed by --kind and --source-topic)."),
    kind: str = typer.Option(None, "--kind", help=_KIND_HELP + " With --all."),
    source_topic: str = typer.Option(None, "--source-topic", help="Only letters from this topic. With --all."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be re-driven; publish nothing."),
    force: bool = typer.Option(False, "--force", help="Re-drive letters that were re-driven before, again."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
) -> None:
    """Republish letters' original records to their source topic and partition (e.g. after a fix).

    Each copy has the original value, key and headers, plus agentstream-redrive naming the letter. A
    letter is re-driven once unless --force; a truncated letter's original is read back from its source
    topic while it is retained. Exits 1 when a letter was refused or its publish failed."""

    from agentstream.ops.dlq import DeadLetters, RedriveResult

    if bool(offsets) == every:
        err.print("[red]error:[/red] name the letters' offsets, or --all (not both)")
        raise typer.Exit(2)
    if (kind or source_topic) and not every:
        err.print("[red]error:[/red] --kind and --source-topic choose letters for --all")
        raise typer.Exit(2)

    settings = _operator_settings(redrive=True)

    async def go() -> list[RedriveResult]:
        async with DeadLetters(settings) as letters:
            return await letters.redrive(offsets or (), every=every, kind=kind, source_topic=source_topic,
                                         dry_run=dry_run, force=force)

    results = run_async(go())
    assert isinstance(results, list)
    if as_json:
        print(json.dumps([r.as_dict() for r in results]))
    elif not results:
        console.print("no dead letters match")
    else:
        colours = {"redriven": "green", "would_redrive": "cyan", "skipped": "yellow"}
        table = Table("offset", "action", "detail")
        for r in results:
            colour = colours.get(r.action, "red")
            table.add_row(str(r.offset), f"[{colour}]{r.action}[/{colour}]", escape(r.detail))
        console.print(table)
    raise typer.Exit(0 if all(r.ok for r in results) else 1)
