"""``agentstream demo``: the stack, the four services and one task, every step and event shown."""

from __future__ import annotations

import typer

from agentstream.cli.common import console, run_async


def demo(
    task: str = typer.Option(None, help="The task (default: a sample arithmetic question)."),
    backend: str = typer.Option(None, help="scripted or llamacpp (default: llamacpp when installed)."),
) -> None:
    """Start the stack and the four services, run one task, show every step and event."""
    import logging

    from agentstream.demo import SAMPLE_TASK, pick_backend, run_demo
    from agentstream.devstack.stack import DevStack

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    with console.status("starting Kafka and PostgreSQL…"):
        DevStack().up()
    ok = run_async(run_demo(task or SAMPLE_TASK, pick_backend(backend), console))
    raise typer.Exit(0 if ok else 1)
