"""Rendered manifests as pods on one host, with ``podman kube play`` (tests and ``bench/perf/kube_play.py``).

podman 4.3 (Debian 12) plays Pods, Deployments (every replica a pod) and ConfigMaps from the file. A
Secret that ``envFrom.secretRef`` names must be a podman secret holding the Secret's ``data`` as JSON
(key -> base64), so it is created here first. A Secret *volume* (each principal's and login's password
file, ``security.enabled``) makes podman 4.3's kube play panic (a nil dereference in ``VolumeFromSecret``),
so the played file mounts the Secret's files from a directory of this host instead (``hostPath``, each
file 0400 and owned by the pod's user, as the kubelet would give it), read-only, at the same path. A Job
is run as its container would be (``podman run``, the same arguments, environment and mounts, a read-only
root); ``job_on_host`` runs one whose image is not here (Kafka's tools) as a process of this host. PodDisruptionBudgets, KEDA ScaledObjects, NetworkPolicies, and the gateway's
Service, Ingress and HorizontalPodAutoscaler are cluster objects with nothing to do on one host: they are
left out of the played file (the gateway's pod is on the host's network: its port is the host's).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import subprocess
import tempfile
import threading
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


def rendering(settings: Settings, image: str, name: str, sets: Sequence[str] = (),
              files: Sequence[Path] = ()) -> list[Obj]:
    """``infra/deploy/values-podman.yaml`` pointed at ``settings``' broker and database, its objects and
    topics under ``name`` (a prefix of their own), running ``image``; ``sets``: more ``--set`` overrides
    (``services.gateway.port=N``, ``services.gateway.enabled=false``); ``files``: more values files
    (``security.passwords``)."""
    repository, _, tag = image.rpartition(":")
    return manifests.render(values.load(
        [values.defaults_file().parent / "values-podman.yaml", *files],
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
        #: The Secrets containers take as environment variables (``envFrom``): podman secrets.
        self.env_secrets = {ref["secretRef"]["name"] for o in objects for c in _containers(o)
                            for ref in c.get("envFrom") or [] if "secretRef" in ref}
        self._secrets_made: list[str] = []
        self._secret_root: Path | None = None
        self._lock = threading.Lock()
        names = [o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"]
        self.prefixes = tuple(f"{n}-pod" for n in names)

    def _podman(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return podman(*args, conf=self.conf, check=check, timeout=timeout)

    def make_secrets(self) -> None:
        for secret in self.secrets:
            name = secret["metadata"]["name"]
            if name not in self.env_secrets:
                continue
            path = self.workdir / f"{name}.secret.json"
            path.write_text(json.dumps(secret["data"]))  # podman 4.3 reads a JSON map of base64 values
            self._podman("secret", "rm", name, check=False)
            self._podman("secret", "create", name, str(path))
            path.unlink()
            self._secrets_made.append(name)

    def _job(self, name: str | None) -> Obj:
        """The Job named ``<namePrefix>-<name>`` (None: the first Job)."""
        return next(o for o in self.objects if o["kind"] == "Job"
                    and (name is None or o["metadata"]["name"].endswith(f"-{name}")))

    def job(self, name: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a Job's container to completion, as a cluster would (``name``: ``migrate``, ``setup``;
        None: the first Job, the migration)."""
        pod = self._job(name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = self._env(container)
        user = int(pod["securityContext"]["runAsUser"])
        args = ["run", "--rm", "--read-only", "--user", str(user)]
        if pod.get("hostNetwork"):
            args += ["--network", "host"]
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        for mount in container.get("volumeMounts") or []:
            secret = (volumes.get(mount["name"]) or {}).get("secret")
            if secret:
                args += ["-v", f"{self._secret_dir(secret['secretName'], user)}:{mount['mountPath']}:ro"]
            else:
                args += ["--tmpfs", mount["mountPath"]]
        for key, value in env.items():
            args += ["-e", f"{key}={value}"]
        if container.get("command"):
            args += ["--entrypoint", container["command"][0]]
        return self._podman(*args, container["image"], *container.get("args", []), check=False, timeout=600)

    def job_on_host(self, name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """Run a Job's container's command as a process of this host, its Secret volumes' files under a
        directory of the work directory at their mount paths (``env`` says where, e.g. ``SECRETS_DIR``
        under ``host_root``, and ``KAFKA_BIN``): for a Job whose image is not on this host."""
        pod = self._job(name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        user = int(pod["securityContext"]["runAsUser"])  # (the same files as its pods', which run as it)
        root = self.host_root
        for mount in container.get("volumeMounts") or []:
            secret = (volumes.get(mount["name"]) or {}).get("secret")
            if secret:
                target = root / mount["mountPath"].lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.exists():
                    target.symlink_to(self._secret_dir(secret["secretName"], user))  # (root reads it anyway)
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        full_env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}, **env}
        return subprocess.run(command, env=full_env, capture_output=True, text=True, timeout=600)

    @property
    def host_root(self) -> Path:
        """Where ``job_on_host`` puts a Job's mounts: ``host_root / <mount path>``."""
        return self.workdir / "host"

    def _secret_dir(self, name: str, user: int) -> Path:
        """The Secret's files in a directory of their own (each key a file, 0400, owned by ``user``), under
        a root that only lets one pass (0711): the work directory may sit under a 0700 one (pytest's), which
        kube play's ``hostPath`` mounts are looked up through, as the pod's user."""
        with self._lock:  # (Jobs may run in threads side by side, as a cluster runs them)
            return self._secret_files(name, user)

    def _secret_files(self, name: str, user: int) -> Path:
        if self._secret_root is None:
            self._secret_root = Path(tempfile.mkdtemp(prefix="agentstream-kube-secrets-"))
            self._secret_root.chmod(0o711)
        directory = self._secret_root / name
        if not directory.exists():
            secret = next(o for o in self.secrets if o["metadata"]["name"] == name)
            directory.mkdir()
            for key, value in secret.get("data", {}).items():
                path = directory / key
                path.write_bytes(base64.b64decode(value))
                path.chmod(0o400)
                if os.getuid() == 0:
                    os.chown(path, user, user)
            directory.chmod(0o755)
        return directory

    def _played(self, obj: Obj) -> Obj:
        """``obj`` as podman 4.3 can play it: Secret volumes as the host's directories of their files."""
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") if obj["kind"] == "Deployment" \
            else obj.get("spec") if obj["kind"] == "Pod" else None
        if not pod or not any("secret" in v for v in pod.get("volumes") or []):
            return obj
        obj = copy.deepcopy(obj)
        pod = obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]
        user = int((pod.get("securityContext") or {}).get("runAsUser") or 0)
        for volume in pod["volumes"]:
            if "secret" in volume:
                directory = self._secret_dir(volume.pop("secret")["secretName"], user)
                volume["hostPath"] = {"path": str(directory), "type": "Directory"}
        return obj

    def _env(self, container: Obj) -> dict[str, str]:
        """The container's environment from its ConfigMap and Secret references (plain values only)."""
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
        self.kube.write_text(to_yaml([self._played(o) for o in self.objects if o["kind"] in PLAYED]))
        self._podman("kube", "play", str(self.kube), timeout=600)

    def pods(self, *, every: bool = False) -> list[str]:
        """Names of this rendering's running pods (``every``: whatever their state)."""
        listed = json.loads(self._podman("pod", "ps", "--format", "json").stdout or "[]")
        return sorted(p["Name"] for p in listed if p["Name"].startswith(self.prefixes)
                      and (every or p["Status"] == "Running"))

    def diagnosis(self) -> str:
        """Each pod's state and the end of its log: for a test's failure message."""
        listed = json.loads(self._podman("pod", "ps", "--format", "json", check=False).stdout or "[]")
        return "\n".join(f"--- {p['Name']} ({p['Status']})\n{self.logs(p['Name'])[-1500:]}" for p in listed
                         if p["Name"].startswith(self.prefixes))

    def kill(self, pod: str) -> None:
        """SIGKILL every container of the pod, then remove it: a node lost, no graceful shutdown."""
        self._podman("pod", "kill", pod)
        self._podman("pod", "rm", "-f", pod)

    def exec(self, pod: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``agentstream ARGS`` in the pod's (first) container, as ``kubectl exec`` would: its image,
        environment and identity (``token create`` from the gateway's pod)."""
        return self._podman("exec", self._container(pod), "agentstream", *args, check=False, timeout=timeout)

    def environment(self, pod: str) -> dict[str, str]:
        """The environment of the pod's (first) container, as the runtime holds it."""
        container = self._container(pod)
        inspected = json.loads(self._podman("container", "inspect", container).stdout)
        info = inspected[0] if isinstance(inspected, list) else inspected
        return dict(entry.partition("=")[::2] for entry in info["Config"]["Env"])

    def _container(self, pod: str) -> str:
        inspected = json.loads(self._podman("pod", "inspect", pod).stdout)
        info = inspected[0] if isinstance(inspected, list) else inspected
        infra = info.get("InfraContainerID")
        return str(next(c["Name"] for c in info.get("Containers") or [] if c["Id"] != infra))

    def logs(self, pod: str) -> str:
        done = self._podman("pod", "logs", pod, check=False)
        return done.stdout + done.stderr  # (the workers log to stderr)

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
        self.remove_secret_files()

    def remove_secret_files(self) -> None:
        """The Secrets' files that the played pods and the Jobs mounted."""
        if self._secret_root is not None:
            shutil.rmtree(self._secret_root, ignore_errors=True)
            self._secret_root = None


def _containers(obj: Obj) -> list[Obj]:
    spec = obj.get("spec") or {}
    pod = (spec.get("template") or {}).get("spec") or spec
    return list(pod.get("containers") or [])


__all__ = ["KubePlay", "PodmanError", "podman", "rendering"]
