"""``agentstream deploy …``: Kubernetes manifests (agentstream/deploy/)."""

from __future__ import annotations

import sys

import typer

from agentstream.cli.common import err

app = typer.Typer(help="Kubernetes manifests for the consumer services (docs/deploy.md).", no_args_is_help=True)


@app.command("render")
def deploy_render(
    values: list[str] = typer.Option(None, "--values", "-f", help="A values file over the defaults "
                                                                  "(repeatable; later files win)."),
    set_: list[str] = typer.Option(None, "--set", help="KEY.PATH=VALUE over the files, e.g. "
                                                       "services.tools.replicas=3 (repeatable)."),
    out: str = typer.Option(None, "--out", help="Write a kustomize base (one file per object and a "
                                                "kustomization.yaml) to this directory instead of printing."),
    show_values: bool = typer.Option(False, "--show-values", help="Print the merged values instead."),
) -> None:
    """The manifests of every enabled service (ConfigMap, Secret, migration Job, Deployments,
    PodDisruptionBudgets, KEDA ScaledObjects, NetworkPolicy) from infra/deploy/values.yaml and yours; with
    security.enabled, a Secret per principal and login, the setup Jobs and each tenant's cell."""
    from pathlib import Path

    from agentstream.deploy import manifests, render
    from agentstream.deploy import values as deploy_values

    merged = deploy_values.load([Path(v) for v in values or []], set_ or [])
    if show_values:
        sys.stdout.write(render.to_yaml([merged]))
        return
    objects = manifests.render(merged)
    if out is None:
        sys.stdout.write(render.to_yaml(objects))
        return
    written = render.write_base(objects, Path(out))
    err.print(f"wrote {len(written)} files to {out}")


@app.command("setup")
def deploy_setup(
    cell: list[str] = typer.Option(None, "--cell", help="A tenant cell, NAME=PREFIX=PRINCIPAL (repeatable)."),
    passwords: str = typer.Option(..., "--passwords", help="A directory with each database login's password "
                                                           "in LOGIN/password (the mounted Secrets)."),
) -> None:
    """What the rendered setup Job runs (security.enabled; docs/deploy.md): each cell's topics, every
    cell's ACLs and the database logins, as the cluster's super user and the schema's owner."""
    from pathlib import Path

    from agentstream.cli.common import run_async
    from agentstream.deploy.setup import CellRef, setup
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    cells = [CellRef.parse(c) for c in cell or []]
    settings = Settings.load(identity=Identity(principal="admin"))
    done = run_async(setup(settings, cells, Path(passwords)))
    err.print(f"set up {done.cells} cells: {done.acls} ACLs, {done.logins} database logins")
