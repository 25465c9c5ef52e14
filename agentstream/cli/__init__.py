"""The ``agentstream`` command: a thin Typer front over the modules that do the work.

One module per group of commands: ``run`` (submit, cancel, status), ``approvals`` (approve, deny,
approvals), ``ingest``, ``worker`` (worker, alerts, migrate), ``ops`` (top, acls), ``demo``, and the
sub-commands ``dev``, ``replay``, ``dlq``, ``session``, ``agent``, ``contract``, ``deploy``, ``mcp`` and ``token``; ``common`` holds what they
share.
A command that runs a process decides who that process is (its ``Identity``: Kafka principal and
database login) and loads its settings with it; nothing else does.
"""

from __future__ import annotations

import sys

import typer
from rich.markup import escape

from agentstream.cli import (
    agent,
    approvals,
    contract,
    demo,
    deploy,
    dev,
    dlq,
    ingest,
    mcp,
    ops,
    replay,
    run,
    session,
    token,
    worker,
)
from agentstream.cli.common import err
from agentstream.streams.core.errors import AgentStreamError
from agentstream.streams.core.extras import missing_extra

app = typer.Typer(help="agentstream: AI agents as event streams on Apache Kafka.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
# In the order the help lists them.
for command in (run.submit, approvals.approve, approvals.deny, approvals.approvals, run.cancel, ingest.ingest,
                run.status, worker.worker, ops.top, worker.alerts, demo.demo, worker.migrate, ops.acls):
    app.command()(command)
app.add_typer(dev.app, name="dev")
app.add_typer(replay.app, name="replay")
app.add_typer(dlq.app, name="dlq")
app.add_typer(session.app, name="session")
app.add_typer(agent.app, name="agent")
app.add_typer(contract.app, name="contract")
app.add_typer(deploy.app, name="deploy")
app.add_typer(token.app, name="token")
app.add_typer(mcp.app, name="mcp")


def main() -> None:
    """Console-script entry: known errors print one clear line (no traceback) and exit 2."""
    try:
        app()
    except AgentStreamError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(2)
    except ModuleNotFoundError as exc:  # a command whose extra is not installed: say which one
        missing = missing_extra(exc, f"agentstream {' '.join(sys.argv[1:3])}".strip())
        if missing is None:
            raise
        err.print(f"[red]error:[/red] {escape(str(missing))}", soft_wrap=True)
        sys.exit(2)
