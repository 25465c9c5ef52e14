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
    PodDisruptionBudgets, KEDA ScaledObjects, NetworkPolicy) from infra/deploy/values.yaml and yours."""
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
