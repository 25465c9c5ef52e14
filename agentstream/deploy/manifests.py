"""Kubernetes objects for every service, built from deploy values (``agentstream/deploy/values.py``).

Why code and not templates: every name the objects carry — consumer groups, topics, the metrics
port's environment variable, the runtime's shutdown grace — comes from the modules that own it
(``Topics``, ``ServiceConfig``), so a rename cannot leave the manifests behind, and a test can check
the objects as data. The output is plain YAML: commit it as a kustomize base and patch it with
overlays, or render it per environment with ``--values``. docs/deploy.md explains each object.

Per service (planner, tools, retrieval, inference, inference-gpu, alerts): a Deployment (probes on
``/healthz`` and ``/readyz``, resources, a non-root read-only container, termination grace longer
than the runtime's), a PodDisruptionBudget and a KEDA ScaledObject; once: a ConfigMap, a Secret, a
NetworkPolicy and the migration Job. The HTTP gateway (``services.gateway``, not a consumer: nothing to
scale on lag) gets a Deployment, a Service, an optional Ingress, a HorizontalPodAutoscaler on its request
rate (or CPU), a PodDisruptionBudget and a NetworkPolicy that lets clients reach its port. With
``security.enabled``: a Secret per Kafka principal and database login, each pod its own of both, the setup
and kafka-config Jobs (``credentials.py``), and per tenant cell (``cells.py``) a ConfigMap and the consumer
services' objects again, named ``…-<cell>-<service>``.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
from typing import Any

from agentstream.deploy.cells import Cell, cells
from agentstream.deploy.credentials import KAFKA_SECRET_DIR, Credentials
from agentstream.deploy.gateway import GatewayObjects
from agentstream.deploy.values import Values, merge
from agentstream.streams.config.stack_state import DEFAULT_DATABASE
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.records import ServiceConfig

Obj = dict[str, Any]

#: Service key in the values -> (the worker's service name, the name of its objects).
SERVICES: dict[str, tuple[str, str]] = {
    "planner": ("planner", "planner"),
    "tools": ("tools", "tools"),
    "retrieval": ("retrieval", "retrieval"),
    "inference": ("inference", "inference"),
    "inferenceGpu": ("inference", "inference-gpu"),
    "alerts": ("alerts", "alerts"),
}
#: Services that serve /metrics, /healthz and /readyz (the alerts app is a faust worker without them).
_PROBED = {"planner", "tools", "retrieval", "inference"}
#: The runtime's grace for in-flight records on shutdown (``ServiceConfig.shutdown_grace_s``), which a
#: pod's termination grace must exceed by ``GRACE_MARGIN_S`` (the producer's flush, leaving the group).
RUNTIME_SHUTDOWN_GRACE_S = ServiceConfig(name="", topics=[], group_id="").shutdown_grace_s
GRACE_MARGIN_S = 5.0
STATE_DIR = "/var/lib/agentstream"
#: A service's Kafka principal and database login (``security.enabled``); None: it uses no database.
#: ``worker all`` is every service at once: the ``worker`` principal and login.
LOGINS: dict[str, str | None] = {"planner": "planner", "tools": "tools", "retrieval": "retrieval",
                                 "inference": "inference", "all": "worker", "alerts": None, "gateway": "gateway"}
def render(values: Values) -> list[Obj]:
    """Every object, in the order ``kubectl apply`` and ``podman kube play`` want them (configuration
    first, then the migration Job, then the workloads and what refers to them)."""
    ctx = _Context(values)
    objects: list[Obj] = [ctx.configmap()]
    if not values.get("existingSecret"):
        objects.append(ctx.secret())
    if ctx.credentials is not None:
        objects += ctx.credentials.secrets()
    if (values.get("migrations") or {}).get("enabled"):
        objects.append(ctx.migration_job())
    if ctx.credentials is not None:
        objects += [ctx.credentials.setup_job(), ctx.credentials.kafka_config_job()]
    for each in (ctx, *(ctx.for_cell(cell) for cell in ctx.cells)):
        objects += each.workloads()
    gateway = (values.get("services") or {}).get("gateway")
    if gateway and gateway.get("enabled"):
        objects += GatewayObjects(ctx).all(gateway)
    if (values.get("networkPolicy") or {}).get("enabled") and not values.get("hostNetwork"):
        objects.append(ctx.network_policy())  # pods on the host's network are outside any NetworkPolicy
        if gateway and gateway.get("enabled"):
            objects.append(GatewayObjects(ctx).network_policy(gateway))
    return objects


class _Context:
    def __init__(self, values: Values) -> None:
        self.v = values
        self.prefix = values.get("namePrefix") or "agentstream"
        kafka = values.get("kafka") or {}
        self.topics = Topics(prefix=kafka.get("topicPrefix") or "", partitions=int(kafka.get("partitions") or 8))
        self.metrics_port = int((values.get("metrics") or {}).get("port") or 0)
        #: The tenant cell whose workloads this context renders (``for_cell``); None: the installation's own.
        self.cell: Cell | None = None
        self.cells = cells(values)
        secure = bool((values.get("security") or {}).get("enabled"))
        #: Every principal's and login's Secret (``security.enabled``): made once, shared by the cells.
        self.credentials = Credentials.of(self) if secure else None

    def for_cell(self, cell: Cell) -> _Context:
        """This context for ``cell``'s workloads: its prefix, its objects' names, its services' values."""
        other = copy.copy(self)
        other.cell = cell
        other.topics = dataclasses.replace(self.topics, prefix=cell.prefix)
        other.v = merge(self.v, {"services": cell.services}) if cell.services else self.v
        return other

    def workloads(self) -> list[Obj]:
        """Each enabled consumer service's Deployment, PodDisruptionBudget and ScaledObject; a cell's own
        ConfigMap first (its topic prefix: a ConfigMap, not a container variable over the installation's,
        because podman 4.3's kube play lets ``envFrom`` win over ``env``, the reverse of Kubernetes)."""
        objects: list[Obj] = [self.configmap()] if self.cell is not None else []
        for key in SERVICES:
            spec = (self.v.get("services") or {}).get(key)
            if not spec or not spec.get("enabled"):
                continue
            objects.append(self.deployment(key, spec))
            if spec.get("pdb"):
                objects.append(self.pdb(key, spec))
            if (self.v.get("keda") or {}).get("enabled") and spec.get("autoscaling"):
                objects.append(self.scaled_object(key, spec))
        return objects

    def suffix(self, suffix: str) -> str:
        """A workload's name (after the prefix): a cell's carry the cell's name."""
        return f"{self.cell.name}-{suffix}" if self.cell else suffix

    def sasl(self) -> tuple[str, str] | None:
        """(security protocol, mechanism) with ``kafka.sasl`` or ``security.enabled``; None: PLAINTEXT."""
        sasl = (self.v.get("kafka") or {}).get("sasl") or {}
        if not sasl and not (self.v.get("security") or {}).get("enabled"):
            return None
        return str(sasl.get("securityProtocol") or "SASL_SSL"), str(sasl.get("mechanism") or "SCRAM-SHA-512")

    def volumes(self, extra: list[Obj]) -> list[Obj]:
        return [{"name": "state", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}, *extra]

    def identity(self, container: Obj, principal: str, login: str | None) -> Obj:
        """``container`` as Kafka ``principal`` and (``security.enabled``) database ``login``: the pod's
        extra fields (its volumes)."""
        volumes = self.kafka_principal(container, principal)
        if self.credentials is not None:
            volumes += self.credentials.database_login(container, login)
        return {"volumes": self.volumes(volumes)} if volumes else {}

    # -- shared pieces ---------------------------------------------------------------------------
    def name(self, suffix: str) -> str:
        return f"{self.prefix}-{suffix}"

    def meta(self, suffix: str, component: str, **extra: Any) -> Obj:
        meta: Obj = {"name": self.name(suffix), "namespace": self.v.get("namespace") or "default",
                     "labels": self.labels(component)}
        meta.update(extra)
        return meta

    def labels(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": "agentstream", "app.kubernetes.io/instance": self.prefix,
                "app.kubernetes.io/component": component}

    def secret_name(self) -> str:
        return str(self.v.get("existingSecret") or self.name("secrets"))

    def env_from(self) -> list[Obj]:
        return [{"configMapRef": {"name": self.name(self.suffix("config"))}}, {"secretRef": {"name": self.secret_name()}}]

    def image(self, spec: Obj) -> str:
        image = dict(self.v.get("image") or {})
        image.update(spec.get("image") or {})
        return f"{image['repository']}:{image.get('tag') or 'latest'}"

    def pod_spec(self, containers: list[Obj], *, restart: str = "Always", extra: Obj | None = None) -> Obj:
        sc = self.v.get("securityContext") or {}
        spec: Obj = {
            "securityContext": {"runAsNonRoot": True, "runAsUser": sc.get("runAsUser", 10001),
                                "runAsGroup": sc.get("runAsGroup", 10001), "fsGroup": sc.get("fsGroup", 10001),
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "restartPolicy": restart,
            "containers": containers,
            "volumes": [{"name": "state", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
        }
        if self.v.get("hostNetwork"):
            spec["hostNetwork"] = True
            spec["dnsPolicy"] = "ClusterFirstWithHostNet"
        spec.update(extra or {})
        return spec

    def container(self, name: str, spec: Obj, args: list[str]) -> Obj:
        pull = (self.v.get("image") or {}).get("pullPolicy") or "IfNotPresent"
        return {
            "name": name, "image": self.image(spec), "imagePullPolicy": pull, "args": args,
            "envFrom": self.env_from(),
            "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "state", "mountPath": STATE_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
        }

    # -- configuration ---------------------------------------------------------------------------
    def configmap(self) -> Obj:
        kafka = self.v.get("kafka") or {}
        tracing = self.v.get("tracing") or {}
        data = {
            "KAFKA_BOOTSTRAP_SERVERS": str(kafka.get("bootstrapServers") or ""),
            "AGENTSTREAM_TOPIC_PREFIX": self.topics.prefix,  # (a cell's: its own)
            "AGENTSTREAM_PARTITIONS": str(self.topics.partitions),
            "AGENTSTREAM_STATE_DIR": STATE_DIR,
            "AGENTSTREAM_METRICS_PORT": str(self.metrics_port),
            # A worker binds loopback unless told otherwise; the kubelet's probes and Prometheus reach a
            # pod through its own address. (values-podman.yaml, on the host's network, keeps loopback.)
            "AGENTSTREAM_METRICS_HOST": str((self.v.get("metrics") or {}).get("host") or "0.0.0.0"),
            "AGENTSTREAM_TRACING": str(tracing.get("mode") or "off"),
        }
        sasl = self.sasl()
        if sasl:
            data["AGENTSTREAM_KAFKA_SECURITY_PROTOCOL"], data["AGENTSTREAM_KAFKA_SASL_MECHANISM"] = sasl
        if data["AGENTSTREAM_TRACING"] == "otlp":
            data["OTEL_EXPORTER_OTLP_ENDPOINT"] = str(tracing.get("otlpEndpoint") or "")
            data["AGENTSTREAM_TRACE_SAMPLE"] = str(tracing.get("sample", 0.1))
        data.update({str(k): str(v) for k, v in (self.v.get("env") or {}).items()})
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta(self.suffix("config"), "config"),
                "data": data}

    def secret(self) -> Obj:
        """The shared Secret: the model server's API key, and without ``security.enabled`` the one
        ``DATABASE_URL`` (with it, each pod's own login: ``credentials.py``)."""
        data: dict[str, str] = {}
        if self.credentials is None:
            data["DATABASE_URL"] = str((self.v.get("database") or {}).get("url")
                                       or f"postgresql://postgres@postgres:5432/{DEFAULT_DATABASE}")
        if self.v.get("modelApiKey"):
            data["AGENTSTREAM_MODEL_API_KEY"] = str(self.v["modelApiKey"])
        # ``data`` (base64), not ``stringData``: podman kube play reads a Secret's data only.
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": self.meta("secrets", "config"),
                "data": encoded}

    def migration_job(self) -> Obj:
        job = self.v.get("migrations") or {}
        container = self.container("migrate", {}, ["migrate"])
        # Creates the topics (the cluster's administrator) and the schema (its owner).
        volumes = self.identity(container, "admin", self.credentials.owner if self.credentials else None)
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": self.meta("migrate", "migrate"),
                "spec": {"backoffLimit": int(job.get("backoffLimit", 6)), "ttlSecondsAfterFinished": 3600,
                         "template": {"metadata": {"labels": self.labels("migrate")},
                                      "spec": self.pod_spec([container], restart="OnFailure",
                                                            extra=volumes)}}}

    # -- workloads ---------------------------------------------------------------------------------
    def args(self, key: str, spec: Obj) -> list[str]:
        args = [str(a) for a in spec.get("args") or []]
        if key in ("inference", "inferenceGpu"):
            for option, field in (("--backend", "backend"), ("--model", "model"), ("--base-url", "baseUrl"),
                                  ("--slots", "slots"), ("--max-seq-len", "maxSeqLen"),
                                  ("--max-num-tokens", "maxNumTokens")):
                if spec.get(field) not in (None, ""):
                    args += [option, str(spec[field])]
            if spec.get("chunkedPrefill") is not None:  # trtllm (docs/gpu.md); on unless turned off
                args.append("--chunked-prefill" if spec["chunkedPrefill"] else "--no-chunked-prefill")
        for module in spec.get("toolModules") or []:
            args += ["--tools", str(module)]
        return args

    def deployment(self, key: str, spec: Obj) -> Obj:
        service, suffix = SERVICES[key]
        suffix = self.suffix(suffix)
        container = self.container(service, spec, self.args(key, spec))
        container["resources"] = spec.get("resources") or {}
        container["env"] = [{"name": "OTEL_SERVICE_NAME", "value": f"agentstream-{suffix}"}]
        if self.cell is not None and service == "planner":  # the cell's planners enforce its quotas
            container["env"] += [{"name": k, "value": v} for k, v in self.cell.quotas.items()]
        if not self.v.get("hostNetwork"):  # what `agentstream top` connects to; on the host's network, its own
            container["env"].append({"name": "AGENTSTREAM_METRICS_ADVERTISE",
                                     "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        annotations: dict[str, str] = {}
        if service in _PROBED and self.metrics_port:
            container["ports"] = [{"name": "metrics", "containerPort": self.metrics_port}]
            # /healthz: the process serves at all (restart it otherwise); /readyz: model loaded or database
            # reachable, every consumer joined and assigned (a rollout waits for a pod that can serve).
            container["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": "metrics"},
                                          "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3}
            container["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": "metrics"},
                                           "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 2}
            # Loading a model (inference) or the embedding model (retrieval) may take minutes.
            container["startupProbe"] = {"httpGet": {"path": "/healthz", "port": "metrics"},
                                         "periodSeconds": 2, "failureThreshold": 150}
            if (self.v.get("metrics") or {}).get("scrape", True):
                annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(self.metrics_port),
                               "prometheus.io/path": "/metrics"}
        grace = int(spec.get("terminationGracePeriodSeconds") or 30)
        if grace < RUNTIME_SHUTDOWN_GRACE_S + GRACE_MARGIN_S:  # the kubelet would SIGKILL mid-handover
            raise ConfigError(f"services.{key}.terminationGracePeriodSeconds={grace}: it must be at least the "
                              f"runtime's shutdown grace ({RUNTIME_SHUTDOWN_GRACE_S:g} s) + {GRACE_MARGIN_S:g} s")
        extra: Obj = {"terminationGracePeriodSeconds": grace,
                      **self.identity(container, "worker" if service == "all" else service, LOGINS.get(service, service))}
        for field in ("nodeSelector", "tolerations", "affinity"):
            if spec.get(field):
                extra[field] = spec[field]
        labels = self.labels(suffix)
        return {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": self.meta(suffix, suffix),
            "spec": {
                "replicas": int(spec.get("replicas", 1)),
                "selector": {"matchLabels": labels},
                # One new pod before an old one goes: a partition's owner changes once per step of the
                # rollout, and the group never has fewer members than before.
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": {"metadata": {"labels": labels, "annotations": annotations},
                             "spec": self.pod_spec([container], extra=extra)},
            },
        }

    def kafka_principal(self, container: Obj, principal: str) -> list[Obj]:
        """With SASL: ``container`` authenticates as ``principal``, its password mounted from the Secret
        ``{secretPrefix}{principal}`` (key ``password``; docs/security.md); returns the pod's volumes this
        takes (none without SASL)."""
        sasl = (self.v.get("kafka") or {}).get("sasl") or {}
        if self.sasl() is None:
            return []
        secret = f"{sasl.get('secretPrefix') or self.name('kafka-')}{principal}"
        container.setdefault("env", []).extend([
            {"name": "AGENTSTREAM_KAFKA_USERNAME", "value": principal},
            {"name": "AGENTSTREAM_KAFKA_PASSWORD_FILE", "value": f"{KAFKA_SECRET_DIR}/password"}])
        container["volumeMounts"].append({"name": "kafka-credentials", "mountPath": KAFKA_SECRET_DIR, "readOnly": True})
        return [{"name": "kafka-credentials", "secret": {"secretName": secret, "defaultMode": 0o400}}]

    def pdb(self, key: str, spec: Obj) -> Obj:
        suffix = self.suffix(SERVICES[key][1]) if key in SERVICES else key
        return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": self.meta(suffix, suffix),
                "spec": {**spec["pdb"], "selector": {"matchLabels": self.labels(suffix)}}}

    def scaled_object(self, key: str, spec: Obj) -> Obj:
        service, suffix = SERVICES[key]
        suffix = self.suffix(suffix)
        scaling = spec["autoscaling"]
        keda = self.v.get("keda") or {}
        if service == "inference":
            # The prompt tokens waiting for the inference group, exported by the planners (so the signal
            # exists at zero inference replicas): docs/deploy.md explains why tokens, not records.
            # The namespace label comes from the scrape configuration (infra/prometheus/prometheus.yml).
            namespace = self.v.get("namespace") or "default"
            query = str(scaling.get("query") or
                        f'sum(agentstream_inference_backlog_prompt_tokens{{namespace="{namespace}"}})')
            trigger: Obj = {"type": "prometheus", "metadata": {
                "serverAddress": str(keda.get("prometheusServer")), "query": query,
                "threshold": str(scaling.get("tokenThreshold", 16000)), "activationThreshold": "0"}}
        else:
            # Consumer lag of the service's group over every topic it reads (the planner reads four).
            trigger = {"type": "kafka", "metadata": {
                "bootstrapServers": str((self.v.get("kafka") or {}).get("bootstrapServers")),
                "consumerGroup": self.topics.group(service), "lagThreshold": str(scaling.get("lagThreshold", 100)),
                "activationLagThreshold": "0", "offsetResetPolicy": "earliest",
                "allowIdleConsumers": "false"}}
        return {
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject", "metadata": self.meta(suffix, suffix),
            "spec": {
                "scaleTargetRef": {"name": self.name(suffix)},
                "pollingInterval": int(keda.get("pollingInterval", 10)),
                "cooldownPeriod": int(keda.get("cooldownPeriod", 300)),
                "minReplicaCount": int(scaling.get("minReplicas", 1)),
                # More consumers than partitions sit idle.
                "maxReplicaCount": min(int(scaling.get("maxReplicas", 4)), self.topics.partitions),
                "triggers": [trigger],
            },
        }

    # -- the HTTP gateway ----------------------------------------------------------------------------
    def network_policy(self) -> Obj:
        policy = self.v.get("networkPolicy") or {}
        kafka_ports = [int(p) for p in (self.v.get("kafka") or {}).get("ports") or [9092]]
        db_port = int((self.v.get("database") or {}).get("port") or 5432)
        tcp = [{"protocol": "TCP", "port": p} for p in (*kafka_ports, db_port)]
        egress: list[Obj] = [
            {"ports": tcp},
            {"ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},  # DNS
            *(policy.get("extraEgress") or []),
        ]
        ingress: list[Obj] = []
        if self.metrics_port:
            ingress.append({
                "from": [{"namespaceSelector": {"matchLabels": {
                    "kubernetes.io/metadata.name": str(policy.get("monitoringNamespace") or "monitoring")}}}],
                "ports": [{"protocol": "TCP", "port": self.metrics_port}]})
        return {
            "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": self.meta("workers", "policy"),
            "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "agentstream",
                                                     "app.kubernetes.io/instance": self.prefix}},
                     "policyTypes": ["Ingress", "Egress"], "ingress": ingress, "egress": egress},
        }


__all__ = ["GRACE_MARGIN_S", "RUNTIME_SHUTDOWN_GRACE_S", "SERVICES", "render"]
