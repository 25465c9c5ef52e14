"""``agentstream top`` and ``acls``: operator tools (agentstream/ops/)."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentstream.cli.common import console, err, run_async


def top(
    endpoints: str = typer.Option(None, help="Metrics endpoints host:port,… (default: the workers registered "
                                             "in PostgreSQL under this topic prefix)."),
    interval: float = typer.Option(2.0, help="Seconds between scrapes (rates are over this interval)."),
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit."),
) -> None:
    """Live dashboard of the workers: steps/s by service, runs/s, lag, backlog, TTFT, tokens/s, errors."""
    from agentstream.ops.top import run_top

    try:
        status = run_async(run_top(endpoints, interval, once, Console()))
    except KeyboardInterrupt:
        status = 0
    raise typer.Exit(status)


def acls(
    apply: bool = typer.Option(False, "--apply", help="Create them on the cluster, as the configured principal "
                                                      "(the cluster's administrator: AGENTSTREAM_KAFKA_USERNAME ...)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
) -> None:
    """The Kafka ACLs each principal needs under the configured topic prefix (docs/security.md), derived
    from the topic contract; `--apply` creates them (idempotent). `dev up --secure` applies them itself."""
    from agentstream.ops.acls import acl_bindings, apply_acls
    from agentstream.streams.config.settings import Settings
    from agentstream.streams.kafka.topics import Topics

    settings = Settings.load()
    bindings = acl_bindings(Topics.of(settings))
    if as_json:
        print(json.dumps([{"principal": f"User:{b.principal}", "operation": b.operation.name,
                           "resource": b.resource.name, "name": b.name, "pattern": b.pattern.name}
                          for b in bindings], indent=2))
    else:
        table = Table("principal", "operation", "resource", "name")
        for b in bindings:
            table.add_row(b.principal, b.operation.name, b.resource.name.lower(),
                          escape(b.name + ("*" if b.pattern.name == "PREFIXED" else "")))
        console.print(table)
    if apply:
        count = run_async(apply_acls(settings.kafka_bootstrap, settings.kafka_auth, bindings))
        err.print(f"created {count} ACLs as {escape(settings.kafka_auth.principal)}")
