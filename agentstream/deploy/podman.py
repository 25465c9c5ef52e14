"""Rendered manifests as pods on one host, with ``podman kube play`` (tests and ``bench/perf/kube_play.py``).

podman 4.3 (Debian 12) plays Pods, Deployments (every replica a pod) and ConfigMaps from the file. A
Secret that ``envFrom.secretRef`` names must be a podman secret holding the Secret's ``data`` as JSON
(key -> base64), so it is created here first. A Job is run as its container would be (``podman run``, the same arguments and
environment, a read-only root). PodDisruptionBudgets, KEDA ScaledObjects, NetworkPolicies, and the gateway's
Service, Ingress and HorizontalPodAutoscaler are cluster objects with nothing to do on one host: they are
left out of the played file (the gateway's pod is on the host's network: its port is the host's).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentstream.deploy import manifests, values
from agentstream.deploy.render import to_yaml
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import PodmanError

Obj = dict[str, Any]
PLAYED = ("ConfigMap", "Pod", "Deployment")


def podman(*args: str, conf: Path | None = None, check: bool = True,
           timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if conf is not None:
        env["CONTAINERS_CONF"] = str(conf)
    done = subprocess.run(["podman", *args], env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise PodmanError(f"podman {' '.join(args[:3])} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done


def rendering(settings: Settings, image: str, name: str, sets: Sequence[str] = ()) -> list[Obj]:
    """``infra/deploy/values-podman.yaml`` pointed at ``settings``' broker and database, its objects and
    topics under ``name`` (a prefix of their own), running ``image``; ``sets``: more ``--set`` overrides
    (``services.gateway.port=N``, ``services.gateway.enabled=false``)."""
    repository, _, tag = image.rpartition(":")
    return manifests.render(values.load(
        [values.defaults_file().parent / "values-podman.yaml"],
        [f"namePrefix={name}", f"kafka.bootstrapServers={settings.kafka_bootstrap}",
         f"database.url={settings.database_url}", f"kafka.topicPrefix={name}.",
         f"kafka.partitions={settings.partitions}", f"image.repository={repository}", f"image.tag={tag}", *sets]))


class KubePlay:
    """One rendering, played: ``job()``, ``play()``, ``pods()``, ``kill(pod)``, ``down()``."""

    def __init__(self, objects: list[Obj], workdir: Path, *, conf: Path | None = None) -> None:
        self.objects = objects
        self.workdir = workdir
        self.conf = conf
        self.kube = workdir / "kube.yaml"
        self.secrets = [o for o in objects if o["kind"] == "Secret"]
        self._secrets_made: list[str] = []
        names = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
        self.prefixes = tuple(f"{n}-pod" for n in names)

    def _podman(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return podman(*args, conf=self.conf, check=check, timeout=timeout)

    def make_secrets(self) -> None:
        for secret in self.secrets:
            name = secret["metadata"]["name"]
            path = self.workdir / f"{name}.secret.json"
            path.write_text(json.dumps(secret["data"]))  # podman 4.3 reads a JSON map of base64 values
            self._podman("secret", "rm", name, check=False)
            self._podman("secret", "create", name, str(path))
            path.unlink()
            self._secrets_made.append(name)

    def job(self, kind: str = "Job") -> subprocess.CompletedProcess[str]:
        """Run the (first) Job's container to completion, as a cluster would."""
        job = next(o for o in self.objects if o["kind"] == kind)
        pod = job["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = self._env(container)
        args = ["run", "--rm", "--read-only", "--user", str(pod["securityContext"]["runAsUser"])]
        if pod.get("hostNetwork"):
            args += ["--network", "host"]
        for mount in container.get("volumeMounts") or []:
            args += ["--tmpfs", mount["mountPath"]]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        return self._podman(*args, container["image"], *container.get("args", []), check=False, timeout=600)

    def _env(self, container: Obj) -> dict[str, str]:
        """The container's environment from its ConfigMap and Secret references (plain values only)."""
        import base64

        env: dict[str, str] = {}
        for ref in container.get("envFrom") or []:
            if "configMapRef" in ref:
                name = ref["configMapRef"]["name"]
                env.update(next(o for o in self.objects if o["kind"] == "ConfigMap"
                                and o["metadata"]["name"] == name)["data"])
            elif "secretRef" in ref:
                name = ref["secretRef"]["name"]
                secret = next(o for o in self.secrets if o["metadata"]["name"] == name)
                env.update({k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()})
        env.update({e["name"]: e["value"] for e in container.get("env") or [] if "value" in e})
        return env

    def play(self) -> None:
        self.make_secrets()
        self.kube.write_text(to_yaml([o for o in self.objects if o["kind"] in PLAYED]))
        self._podman("kube", "play", str(self.kube), timeout=600)

    def pods(self) -> list[str]:
        """Names of this rendering's running pods."""
        listed = json.loads(self._podman("pod", "ps", "--format", "json").stdout or "[]")
        return sorted(p["Name"] for p in listed if p["Name"].startswith(self.prefixes) and p["Status"] == "Running")

    def kill(self, pod: str) -> None:
        """SIGKILL every container of the pod, then remove it: a node lost, no graceful shutdown."""
        self._podman("pod", "kill", pod)
        self._podman("pod", "rm", "-f", pod)

    def exec(self, pod: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``agentstream ARGS`` in the pod's (first) container, as ``kubectl exec`` would: its image,
        environment and identity (``token create`` from the gateway's pod)."""
        inspected = json.loads(self._podman("pod", "inspect", pod).stdout)
        info = inspected[0] if isinstance(inspected, list) else inspected
        infra = info.get("InfraContainerID")
        container = next(c["Name"] for c in info.get("Containers") or [] if c["Id"] != infra)
        return self._podman("exec", container, "agentstream", *args, check=False, timeout=timeout)

    def logs(self, pod: str) -> str:
        return self._podman("pod", "logs", pod, check=False).stdout

    def down(self) -> None:
        """Everything this rendering created, also after a play that failed half-way."""
        if self.kube.exists():
            self._podman("kube", "down", str(self.kube), check=False)
        listed = json.loads(self._podman("pod", "ps", "--format", "json", check=False).stdout or "[]")
        for pod in listed:
            if pod["Name"].startswith(self.prefixes):
                self._podman("pod", "rm", "-f", pod["Name"], check=False)
        for name in self._secrets_made:
            self._podman("secret", "rm", name, check=False)
        self._secrets_made.clear()


__all__ = ["KubePlay", "PodmanError", "podman", "rendering"]
