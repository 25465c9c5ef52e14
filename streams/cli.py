"""The ``agentstream`` command: a thin Typer front over the modules that do the work."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.table import Table

from streams.errors import AgentStreamError

app = typer.Typer(help="agentstream: AI agents as event streams on Apache Kafka.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
dev = typer.Typer(help="The local development stack: Kafka (KRaft) and PostgreSQL + pgvector.",
                  no_args_is_help=True)
app.add_typer(dev, name="dev")

console = Console()
err = Console(stderr=True)


@dev.command("up")
def dev_up(
    kafka_port: int = typer.Option(None, help="Broker port on 127.0.0.1 (controller: the next port)."),
    pg_port: int = typer.Option(None, help="PostgreSQL port on 127.0.0.1."),
) -> None:
    """Start Kafka and PostgreSQL (if not running), apply migrations, print where they listen."""
    from streams.devstack.stack import DevStack

    with console.status("starting Kafka and PostgreSQL…"):
        status = DevStack().up(kafka_port=kafka_port, pg_port=pg_port)
    console.print(f"[green]stack is up[/green]\n  KAFKA_BOOTSTRAP_SERVERS={status.kafka}\n"
                  f"  DATABASE_URL={status.database_url}")


@dev.command("down")
def dev_down(purge: bool = typer.Option(False, help="Also delete the broker's and database's data.")) -> None:
    """Stop the local stack (never a cluster named by KAFKA_BOOTSTRAP_SERVERS / DATABASE_URL)."""
    from streams.devstack.stack import DevStack

    stopped = DevStack().down(purge=purge)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@dev.command("status")
def dev_status(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Show where Kafka and PostgreSQL are and whether they are running (exit 1 when not)."""
    from streams.devstack.stack import DevStack

    status = DevStack().status()
    if as_json:
        print(json.dumps(status.public()))
    else:
        table = Table(show_header=True, header_style="bold")
        table.add_column("service")
        table.add_column("address")
        table.add_column("running")
        table.add_column("pid")
        table.add_row("kafka", status.kafka, _yes(status.kafka_running), str(status.kafka_pid or "-"))
        table.add_row("postgres", status.database_url, _yes(status.postgres_running),
                      str(status.postgres_pid or "-"))
        console.print(table)
    raise typer.Exit(0 if status.running else 1)


@dev.command("check")
def dev_check() -> None:
    """Produce, consume and commit a record on a throwaway topic and round-trip a vector."""
    import asyncio

    from streams.config import Settings
    from streams.devstack.check import run_check

    settings = Settings.load()
    table = Table("step", "result", "ms", title=f"Kafka {settings.kafka_bootstrap} · {settings.database_url}")
    for step in asyncio.run(run_check(settings)):
        table.add_row(step.name, step.detail, f"{step.ms:.1f}")
    console.print(table)


def _yes(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]no[/red]"


def main() -> None:
    """Console-script entry: known errors print one clear line (no traceback) and exit 2."""
    try:
        app()
    except AgentStreamError as exc:
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
