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
rate (or CPU), a PodDisruptionBudget and a NetworkPolicy that lets clients reach its port.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from agentstream.deploy.values import Values
from agentstream.services.gateway.settings import GatewaySettings
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
#: Where a pod finds its Kafka password (``kafka.sasl``): a file, never an environment variable's value.
KAFKA_SECRET_DIR = "/var/run/secrets/agentstream-kafka"
#: The gateway's request counter (services/gateway/metrics.py, ``agentstream_gateway_requests_total``) as
#: the Prometheus adapter serves its rate to the HPA (the adapter rule: docs/deploy.md, "The gateway").
GATEWAY_REQUESTS_SERIES = "agentstream_gateway_requests_total"
GATEWAY_RATE_METRIC = "agentstream_gateway_requests_per_second"
#: uvicorn's graceful shutdown in the gateway (services/gateway/server.py, ``timeout_graceful_shutdown``).
GATEWAY_SHUTDOWN_GRACE_S = 5.0
#: ``services.gateway.settings`` keys (camelCase) -> ``GatewaySettings`` fields -> AGENTSTREAM_GATEWAY_<FIELD>.
#: Host and port are values of their own (the container's port and the probes use them).
GATEWAY_SETTINGS = tuple(f.name for f in dataclasses.fields(GatewaySettings) if f.name not in ("host", "port"))


def render(values: Values) -> list[Obj]:
    """Every object, in the order ``kubectl apply`` and ``podman kube play`` want them (configuration
    first, then the migration Job, then the workloads and what refers to them)."""
    ctx = _Context(values)
    objects: list[Obj] = [ctx.configmap()]
    if not values.get("existingSecret"):
        objects.append(ctx.secret())
    if (values.get("migrations") or {}).get("enabled"):
        objects.append(ctx.migration_job())
    for key in SERVICES:
        spec = (values.get("services") or {}).get(key)
        if not spec or not spec.get("enabled"):
            continue
        objects.append(ctx.deployment(key, spec))
        if spec.get("pdb"):
            objects.append(ctx.pdb(key, spec))
        if (values.get("keda") or {}).get("enabled") and spec.get("autoscaling"):
            objects.append(ctx.scaled_object(key, spec))
    gateway = (values.get("services") or {}).get("gateway")
    if gateway and gateway.get("enabled"):
        objects += ctx.gateway(gateway)
    if (values.get("networkPolicy") or {}).get("enabled") and not values.get("hostNetwork"):
        objects.append(ctx.network_policy())  # pods on the host's network are outside any NetworkPolicy
        if gateway and gateway.get("enabled"):
            objects.append(ctx.gateway_network_policy(gateway))
    return objects


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


class _Context:
    def __init__(self, values: Values) -> None:
        self.v = values
        self.prefix = values.get("namePrefix") or "agentstream"
        kafka = values.get("kafka") or {}
        self.topics = Topics(prefix=kafka.get("topicPrefix") or "", partitions=int(kafka.get("partitions") or 8))
        self.metrics_port = int((values.get("metrics") or {}).get("port") or 0)

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
        return [{"configMapRef": {"name": self.name("config")}}, {"secretRef": {"name": self.secret_name()}}]

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
            "AGENTSTREAM_TOPIC_PREFIX": str(kafka.get("topicPrefix") or ""),
            "AGENTSTREAM_PARTITIONS": str(self.topics.partitions),
            "AGENTSTREAM_STATE_DIR": STATE_DIR,
            "AGENTSTREAM_METRICS_PORT": str(self.metrics_port),
            # A worker binds loopback unless told otherwise; the kubelet's probes and Prometheus reach a
            # pod through its own address. (values-podman.yaml, on the host's network, keeps loopback.)
            "AGENTSTREAM_METRICS_HOST": str((self.v.get("metrics") or {}).get("host") or "0.0.0.0"),
            "AGENTSTREAM_TRACING": str(tracing.get("mode") or "off"),
        }
        sasl = kafka.get("sasl") or {}
        if sasl:
            data["AGENTSTREAM_KAFKA_SECURITY_PROTOCOL"] = str(sasl.get("securityProtocol") or "SASL_SSL")
            data["AGENTSTREAM_KAFKA_SASL_MECHANISM"] = str(sasl.get("mechanism") or "SCRAM-SHA-512")
        if data["AGENTSTREAM_TRACING"] == "otlp":
            data["OTEL_EXPORTER_OTLP_ENDPOINT"] = str(tracing.get("otlpEndpoint") or "")
            data["AGENTSTREAM_TRACE_SAMPLE"] = str(tracing.get("sample", 0.1))
        data.update({str(k): str(v) for k, v in (self.v.get("env") or {}).items()})
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": self.meta("config", "config"), "data": data}

    def secret(self) -> Obj:
        data = {"DATABASE_URL": str((self.v.get("database") or {}).get("url")
                                    or f"postgresql://postgres@postgres:5432/{DEFAULT_DATABASE}")}
        if self.v.get("modelApiKey"):
            data["AGENTSTREAM_MODEL_API_KEY"] = str(self.v["modelApiKey"])
        # ``data`` (base64), not ``stringData``: podman kube play reads a Secret's data only.
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": self.meta("secrets", "config"),
                "data": encoded}

    def migration_job(self) -> Obj:
        job = self.v.get("migrations") or {}
        container = self.container("migrate", {}, ["migrate"])
        volumes = self.kafka_principal(container, "admin")  # creates the topics: the cluster's administrator
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
        container = self.container(service, spec, self.args(key, spec))
        container["resources"] = spec.get("resources") or {}
        container["env"] = [{"name": "OTEL_SERVICE_NAME", "value": f"agentstream-{suffix}"}]
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
                      **self.kafka_principal(container, "worker" if service == "all" else service)}
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

    def kafka_principal(self, container: Obj, principal: str) -> Obj:
        """With ``kafka.sasl``: ``container`` authenticates as ``principal``, its password mounted from the
        Secret ``{secretPrefix}{principal}`` (key ``password``; docs/security.md); returns the pod's extra
        volumes (none without SASL)."""
        sasl = (self.v.get("kafka") or {}).get("sasl") or {}
        if not sasl:
            return {}
        secret = f"{sasl.get('secretPrefix') or 'agentstream-kafka-'}{principal}"
        container.setdefault("env", []).extend([
            {"name": "AGENTSTREAM_KAFKA_USERNAME", "value": principal},
            {"name": "AGENTSTREAM_KAFKA_PASSWORD_FILE", "value": f"{KAFKA_SECRET_DIR}/password"}])
        container["volumeMounts"].append({"name": "kafka-credentials", "mountPath": KAFKA_SECRET_DIR, "readOnly": True})
        return {"volumes": [{"name": "state", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
                            {"name": "kafka-credentials", "secret": {"secretName": secret, "defaultMode": 0o400}}]}

    def pdb(self, key: str, spec: Obj) -> Obj:
        suffix = SERVICES[key][1] if key in SERVICES else key
        return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": self.meta(suffix, suffix),
                "spec": {**spec["pdb"], "selector": {"matchLabels": self.labels(suffix)}}}

    def scaled_object(self, key: str, spec: Obj) -> Obj:
        service, suffix = SERVICES[key]
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
    def gateway(self, spec: Obj) -> list[Obj]:
        """The gateway's Deployment, Service, PodDisruptionBudget, Ingress (when asked) and autoscaler."""
        objects = [self.gateway_deployment(spec), self.gateway_service(spec)]
        if spec.get("pdb"):
            objects.append(self.pdb("gateway", spec))
        ingress = spec.get("ingress") or {}
        if ingress.get("enabled"):
            objects.append(self.gateway_ingress(spec, ingress))
        scaling = spec.get("autoscaling") or {}
        if scaling.get("enabled"):
            objects.append(self.gateway_hpa(spec, scaling))
        return objects

    def gateway_port(self, spec: Obj) -> int:
        port = int(spec.get("port") or 8080)
        if not 0 < port < 65536:
            raise ConfigError(f"services.gateway.port={port}: a port from 1 to 65535 (the probes need a fixed one)")
        return port

    def gateway_target(self, spec: Obj) -> str | int:
        """The pod's port as probes and the Service name it: ``http``, or its number on the host's network
        (where the container declares no port)."""
        return self.gateway_port(spec) if self.v.get("hostNetwork") else "http"

    def gateway_env(self, spec: Obj) -> list[Obj]:
        """``AGENTSTREAM_GATEWAY_*`` from ``services.gateway.settings`` (camelCase ``GatewaySettings`` fields;
        an unknown key is an error, not a variable nobody reads)."""
        env = [{"name": "AGENTSTREAM_GATEWAY_HOST", "value": str(spec.get("host") or "0.0.0.0")},
               {"name": "AGENTSTREAM_GATEWAY_PORT", "value": str(self.gateway_port(spec))}]
        for key, value in (spec.get("settings") or {}).items():
            field = _snake(str(key))
            if field not in GATEWAY_SETTINGS:
                known = ", ".join(_camel(f) for f in GATEWAY_SETTINGS)
                raise ConfigError(f"services.gateway.settings.{key}: not a gateway setting (one of {known})")
            if value is None:
                continue
            text = ",".join(str(v) for v in value) if isinstance(value, list | tuple) else str(value)
            env.append({"name": f"AGENTSTREAM_GATEWAY_{field.upper()}", "value": text})
        return env

    def gateway_deployment(self, spec: Obj) -> Obj:
        port = self.gateway_port(spec)
        container = self.container("gateway", spec, [str(a) for a in spec.get("args") or ["worker", "gateway"]])
        container["resources"] = spec.get("resources") or {}
        container["env"] = [{"name": "OTEL_SERVICE_NAME", "value": "agentstream-gateway"}, *self.gateway_env(spec)]
        if spec.get("databaseSecret"):
            # The gateway's own PostgreSQL login (role agentstream_gateway: docs/security.md), not the
            # schema owner's URL every worker shares: a variable of the container wins over envFrom.
            container["env"].append({"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {
                "name": str(spec["databaseSecret"]), "key": str(spec.get("databaseSecretKey") or "DATABASE_URL")}}})
        target = self.gateway_target(spec)
        if not self.v.get("hostNetwork"):  # (podman refuses a port mapping on the host's network)
            container["ports"] = [{"name": "http", "containerPort": port}]
        # /healthz: the process serves HTTP; /readyz: PostgreSQL answers (every request's token is checked
        # there). The gateway loads no model and joins no group: it is up in seconds.
        container["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": target},
                                      "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3}
        container["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": target},
                                       "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 2}
        container["startupProbe"] = {"httpGet": {"path": "/healthz", "port": target},
                                     "periodSeconds": 1, "failureThreshold": 60}
        pause = int(spec.get("preStopSleepS", 5) or 0) if not self.v.get("hostNetwork") else 0
        if pause:
            # Still answer while the endpoint leaves the Service and the load balancers: new requests
            # stop arriving before uvicorn stops accepting them. (SSE streams then end; their clients
            # resume on another replica with Last-Event-ID, losing nothing.)
            container["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(pause)]}}}
        grace = int(spec.get("terminationGracePeriodSeconds") or 30)
        if grace < pause + GATEWAY_SHUTDOWN_GRACE_S + GRACE_MARGIN_S:
            raise ConfigError(f"services.gateway.terminationGracePeriodSeconds={grace}: it must be at least the "
                              f"preStop sleep ({pause} s) + uvicorn's graceful shutdown "
                              f"({GATEWAY_SHUTDOWN_GRACE_S:g} s) + {GRACE_MARGIN_S:g} s")
        annotations: dict[str, str] = {}
        if (self.v.get("metrics") or {}).get("scrape", True):
            annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                           "prometheus.io/path": "/metrics"}
        extra: Obj = {"terminationGracePeriodSeconds": grace, **self.kafka_principal(container, "gateway")}
        for field in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
            if spec.get(field):
                extra[field] = spec[field]
        labels = self.labels("gateway")
        return {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": self.meta("gateway", "gateway"),
            "spec": {
                "replicas": int(spec.get("replicas", 2)),
                "selector": {"matchLabels": labels},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": {"metadata": {"labels": labels, "annotations": annotations},
                             "spec": self.pod_spec([container], extra=extra)},
            },
        }

    def gateway_service(self, spec: Obj) -> Obj:
        service = spec.get("service") or {}
        port = {"name": "http", "port": int(service.get("port") or 80), "targetPort": self.gateway_target(spec),
                "protocol": "TCP"}
        out: Obj = {"apiVersion": "v1", "kind": "Service",
                    "metadata": self.meta("gateway", "gateway", **({"annotations": dict(service["annotations"])}
                                                                   if service.get("annotations") else {})),
                    "spec": {"type": str(service.get("type") or "ClusterIP"), "selector": self.labels("gateway"),
                             "ports": [port]}}
        return out

    def gateway_ingress(self, spec: Obj, ingress: Obj) -> Obj:
        if not ingress.get("host"):
            raise ConfigError("services.gateway.ingress.host: the host name clients use (required with "
                              "services.gateway.ingress.enabled)")
        host = str(ingress["host"])
        backend = {"service": {"name": self.name("gateway"), "port": {"name": "http"}}}
        body: Obj = {"rules": [{"host": host, "http": {"paths": [{
            "path": str(ingress.get("path") or "/"), "pathType": str(ingress.get("pathType") or "Prefix"),
            "backend": backend}]}}]}
        if ingress.get("className"):
            body = {"ingressClassName": str(ingress["className"]), **body}
        if ingress.get("tlsSecret"):
            body["tls"] = [{"hosts": [host], "secretName": str(ingress["tlsSecret"])}]
        meta = self.meta("gateway", "gateway")
        if ingress.get("annotations"):
            meta["annotations"] = {str(k): str(v) for k, v in ingress["annotations"].items()}
        return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": body}

    def gateway_hpa(self, spec: Obj, scaling: Obj) -> Obj:
        """autoscaling/v2 on the replicas' average request rate (a Pods metric, which the Prometheus adapter
        serves from ``agentstream_gateway_requests_total``), or on CPU utilisation (``metric: cpu``)."""
        metric = str(scaling.get("metric") or "requests")
        if metric == "requests":
            target: Obj = {"type": "Pods", "pods": {
                "metric": {"name": GATEWAY_RATE_METRIC},
                "target": {"type": "AverageValue", "averageValue": str(scaling.get("requestsPerSecond", 100))}}}
        elif metric == "cpu":
            if not ((spec.get("resources") or {}).get("requests") or {}).get("cpu"):
                raise ConfigError("services.gateway.autoscaling.metric=cpu needs services.gateway.resources."
                                  "requests.cpu (utilisation is a share of the request)")
            target = {"type": "Resource", "resource": {
                "name": "cpu", "target": {"type": "Utilization",
                                          "averageUtilization": int(scaling.get("cpuUtilization", 70))}}}
        else:
            raise ConfigError(f"services.gateway.autoscaling.metric={metric!r}: requests or cpu")
        low, high = int(scaling.get("minReplicas", 2)), int(scaling.get("maxReplicas", 10))
        if not 1 <= low <= high:
            raise ConfigError(f"services.gateway.autoscaling: minReplicas {low} and maxReplicas {high} must "
                              "satisfy 1 <= min <= max")
        hpa: Obj = {
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": self.meta("gateway", "gateway"),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.name("gateway")},
                "minReplicas": low, "maxReplicas": high, "metrics": [target],
            },
        }
        if scaling.get("behavior"):
            hpa["spec"]["behavior"] = scaling["behavior"]
        return hpa

    def gateway_network_policy(self, spec: Obj) -> Obj:
        """The workers' policy admits only the monitoring namespace, to the metrics port; clients (an
        ingress controller, services in the cluster) reach the gateway's port through this one (policies
        add up). ``networkPolicy.gatewayFrom``: NetworkPolicyPeers; empty: from anywhere."""
        rule: Obj = {"ports": [{"protocol": "TCP", "port": self.gateway_port(spec)}]}
        peers = (self.v.get("networkPolicy") or {}).get("gatewayFrom") or []
        if peers:
            rule["from"] = list(peers)
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": self.meta("gateway", "policy"),
                "spec": {"podSelector": {"matchLabels": self.labels("gateway")}, "policyTypes": ["Ingress"],
                         "ingress": [rule]}}

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


__all__ = ["GATEWAY_RATE_METRIC", "GATEWAY_REQUESTS_SERIES", "GATEWAY_SETTINGS", "GATEWAY_SHUTDOWN_GRACE_S",
           "GRACE_MARGIN_S",
           "RUNTIME_SHUTDOWN_GRACE_S", "SERVICES", "render"]
