"""``agentstream dev …``: the local development stack (agentstream/devstack/)."""

from __future__ import annotations

import json

import typer
from rich.markup import escape
from rich.table import Table

from agentstream.cli.common import console, yes

app = typer.Typer(help="The local development stack: Kafka (KRaft) and PostgreSQL + pgvector.",
                  no_args_is_help=True)


@app.command("up")
def dev_up(
    kafka_port: int = typer.Option(None, help="Broker port on 127.0.0.1 (controller: the next port)."),
    pg_port: int = typer.Option(None, help="PostgreSQL port on 127.0.0.1."),
    brokers: int = typer.Option(None, min=1, help="Kafka nodes: 1 (the default), or a cluster (3: every topic "
                                                 "has 3 replicas, writes need 2), on ports N, N+2, N+4."),
    secure: bool = typer.Option(None, "--secure/--insecure",
                                help="Kafka with SASL/SCRAM, a principal per service and ACLs (docs/security.md); "
                                     "default: as the stack was started. Switching needs `dev down --purge`."),
    tenant: list[str] = typer.Option(None, "--tenant", help="With --secure: a tenant (repeatable): its own topic "
                                                          "prefix NAME., Kafka principal tenant-NAME and database "
                                                          "logins (docs/security.md, \"Tenants\")."),
) -> None:
    """Start Kafka and PostgreSQL (if not running), apply migrations, print where they listen."""
    from agentstream.devstack.stack import DevStack
    from agentstream.streams.config.masking import mask_url

    stack = DevStack()
    with console.status("starting Kafka and PostgreSQL…"):
        status = stack.up(kafka_port=kafka_port, pg_port=pg_port, brokers=brokers, secure=secure,
                          tenants=tuple(tenant) if tenant else None)
    console.print(f"[green]stack is up[/green]\n  KAFKA_BOOTSTRAP_SERVERS={escape(mask_url(status.kafka))}\n"
                  f"  DATABASE_URL={escape(mask_url(status.database_url))}")
    if status.secure:
        console.print(f"  Kafka: SASL_PLAINTEXT, SCRAM-SHA-512; each principal's password in "
                      f"{escape(str(stack.secrets_dir))}/<principal>.password")


@app.command("down")
def dev_down(purge: bool = typer.Option(False, help="Also delete the broker's and database's data.")) -> None:
    """Stop the local stack (never a cluster named by KAFKA_BOOTSTRAP_SERVERS / DATABASE_URL)."""
    from agentstream.devstack.stack import DevStack

    stopped = DevStack().down(purge=purge)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command("status")
def dev_status(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Show where Kafka and PostgreSQL are and whether they are running (exit 1 when not). Passwords in
    the URLs are masked; the stack's own are in its state file (stack.json, readable by its owner only)."""
    from agentstream.devstack.stack import DevStack
    from agentstream.streams.config.masking import mask_url

    status = DevStack().status()
    if as_json:
        print(json.dumps(status.public()))
    else:
        table = Table(show_header=True, header_style="bold")
        table.add_column("service")
        table.add_column("address")
        table.add_column("running")
        table.add_column("pid")
        if len(status.brokers) > 1:
            for broker in status.brokers:
                table.add_row(f"kafka {broker.node_id}", escape(mask_url(broker.address)), yes(broker.running),
                              str(broker.pid or "-"))
        else:
            table.add_row("kafka", escape(mask_url(status.kafka)), yes(status.kafka_running),
                          str(status.kafka_pid or "-"))
        table.add_row("postgres", escape(mask_url(status.database_url)), yes(status.postgres_running),
                      str(status.postgres_pid or "-"))
        console.print(table)
    raise typer.Exit(0 if status.running else 1)


@app.command("check")
def dev_check() -> None:
    """Produce, consume and commit a record on a throwaway topic and round-trip a vector."""
    import asyncio

    from agentstream.devstack.check import run_check
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.masking import mask_url
    from agentstream.streams.config.settings import Settings

    # On a secure stack: a throwaway topic is the administrator's to create.
    settings = Settings.load(identity=Identity(principal="admin"))
    table = Table("step", "result", "ms", title=escape(f"Kafka {mask_url(settings.kafka_bootstrap)} · "
                                                       f"{mask_url(settings.database_url)}"))
    for step in asyncio.run(run_check(settings)):
        table.add_row(step.name, step.detail, f"{step.ms:.1f}")
    console.print(table)

