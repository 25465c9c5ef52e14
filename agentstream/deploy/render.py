"""Rendered objects as YAML: one multi-document stream (``kubectl apply -f -``, ``podman kube play``) or
a directory that is a kustomize base (one file per object, a ``kustomization.yaml`` listing them), for
overlays that patch replicas, resources or images per environment."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentstream.deploy.values import _yaml


def _dump(obj: Any) -> str:
    text: str = _yaml().safe_dump(obj, sort_keys=False, default_flow_style=False, width=120)
    return text


def to_yaml(objects: Iterable[dict[str, Any]]) -> str:
    return "---\n".join(_dump(o) for o in objects)


def file_name(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['name']}.{obj['kind'].lower()}.yaml"


def write_base(objects: list[dict[str, Any]], out: Path) -> list[Path]:
    """One file per object and a ``kustomization.yaml``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for obj in objects:
        path = out / file_name(obj)
        path.write_text(_dump(obj))
        written.append(path)
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": [p.name for p in written]}
    (out / "kustomization.yaml").write_text(_dump(kustomization))
    return [*written, out / "kustomization.yaml"]


__all__ = ["file_name", "to_yaml", "write_base"]
