"""The HTTP gateway's Kubernetes objects (``services.gateway`` in the values): a Deployment (probes on
``/healthz`` and ``/readyz``, a preStop pause so a leaving pod keeps answering while it leaves the
Service), a Service, an optional Ingress, a HorizontalPodAutoscaler on its request rate (or CPU), a
PodDisruptionBudget and a NetworkPolicy that lets clients reach its port. The gateway is not a consumer:
nothing to scale on lag, no group to join. Built on the renderer's shared pieces (``manifests._Context``:
names, labels, the container, the pod, the Kafka principal). docs/deploy.md, "The gateway".
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from agentstream.services.gateway.settings import GatewaySettings
from agentstream.streams.core.errors import ConfigError

if TYPE_CHECKING:
    from agentstream.deploy.manifests import _Context

Obj = dict[str, Any]

#: The gateway's request counter (services/gateway/metrics.py, ``agentstream_gateway_requests_total``) as
#: the Prometheus adapter serves its rate to the HPA (the adapter rule: docs/deploy.md, "The gateway").
GATEWAY_REQUESTS_SERIES = "agentstream_gateway_requests_total"
GATEWAY_RATE_METRIC = "agentstream_gateway_requests_per_second"
#: uvicorn's graceful shutdown in the gateway (services/gateway/server.py, ``timeout_graceful_shutdown``).
GATEWAY_SHUTDOWN_GRACE_S = 5.0
#: ``services.gateway.settings`` keys (camelCase) -> ``GatewaySettings`` fields -> AGENTSTREAM_GATEWAY_<FIELD>.
#: Host and port are values of their own (the container's port and the probes use them).
GATEWAY_SETTINGS = tuple(f.name for f in dataclasses.fields(GatewaySettings) if f.name not in ("host", "port"))


class GatewayObjects:
    """The gateway's objects, rendered in ``ctx`` (the values and the renderer's shared pieces)."""

    def __init__(self, ctx: _Context) -> None:
        self.ctx = ctx

    def all(self, spec: Obj) -> list[Obj]:
        """The gateway's Deployment, Service, PodDisruptionBudget, Ingress (when asked) and autoscaler."""
        objects = [self.deployment(spec), self.service(spec)]
        if spec.get("pdb"):
            objects.append(self.ctx.pdb("gateway", spec))
        ingress = spec.get("ingress") or {}
        if ingress.get("enabled"):
            objects.append(self.ingress(spec, ingress))
        scaling = spec.get("autoscaling") or {}
        if scaling.get("enabled"):
            objects.append(self.hpa(spec, scaling))
        return objects

    def port(self, spec: Obj) -> int:
        port = int(spec.get("port") or 8080)
        if not 0 < port < 65536:
            raise ConfigError(f"services.gateway.port={port}: a port from 1 to 65535 (the probes need a fixed one)")
        return port

    def target(self, spec: Obj) -> str | int:
        """The pod's port as probes and the Service name it: ``http``, or its number on the host's network
        (where the container declares no port)."""
        return self.port(spec) if self.ctx.v.get("hostNetwork") else "http"

    def env(self, spec: Obj) -> list[Obj]:
        """``AGENTSTREAM_GATEWAY_*`` from ``services.gateway.settings`` (camelCase ``GatewaySettings`` fields;
        an unknown key is an error, not a variable nobody reads)."""
        env = [{"name": "AGENTSTREAM_GATEWAY_HOST", "value": str(spec.get("host") or "0.0.0.0")},
               {"name": "AGENTSTREAM_GATEWAY_PORT", "value": str(self.port(spec))}]
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

    def deployment(self, spec: Obj) -> Obj:
        port = self.port(spec)
        container = self.ctx.container("gateway", spec, [str(a) for a in spec.get("args") or ["worker", "gateway"]])
        container["resources"] = spec.get("resources") or {}
        container["env"] = [{"name": "OTEL_SERVICE_NAME", "value": "agentstream-gateway"}, *self.env(spec)]
        if spec.get("databaseSecret") and self.ctx.credentials is None:  # (secure: its own login, below)
            # The gateway's own PostgreSQL login (role agentstream_gateway: docs/security.md), not the
            # schema owner's URL every worker shares: a variable of the container wins over envFrom.
            container["env"].append({"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {
                "name": str(spec["databaseSecret"]), "key": str(spec.get("databaseSecretKey") or "DATABASE_URL")}}})
        target = self.target(spec)
        if not self.ctx.v.get("hostNetwork"):  # (podman refuses a port mapping on the host's network)
            container["ports"] = [{"name": "http", "containerPort": port}]
        # /healthz: the process serves HTTP; /readyz: PostgreSQL answers (every request's token is checked
        # there). The gateway loads no model and joins no group: it is up in seconds.
        container["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": target},
                                      "periodSeconds": 10, "timeoutSeconds": 3, "failureThreshold": 3}
        container["readinessProbe"] = {"httpGet": {"path": "/readyz", "port": target},
                                       "periodSeconds": 2, "timeoutSeconds": 3, "failureThreshold": 2}
        container["startupProbe"] = {"httpGet": {"path": "/healthz", "port": target},
                                     "periodSeconds": 1, "failureThreshold": 60}
        pause = int(spec.get("preStopSleepS", 5) or 0) if not self.ctx.v.get("hostNetwork") else 0
        if pause:
            # Still answer while the endpoint leaves the Service and the load balancers: new requests
            # stop arriving before uvicorn stops accepting them. (SSE streams then end; their clients
            # resume on another replica with Last-Event-ID, losing nothing.)
            container["lifecycle"] = {"preStop": {"exec": {"command": ["sleep", str(pause)]}}}
        from agentstream.deploy.manifests import GRACE_MARGIN_S  # (manifests imports this module)

        grace = int(spec.get("terminationGracePeriodSeconds") or 30)
        if grace < pause + GATEWAY_SHUTDOWN_GRACE_S + GRACE_MARGIN_S:
            raise ConfigError(f"services.gateway.terminationGracePeriodSeconds={grace}: it must be at least the "
                              f"preStop sleep ({pause} s) + uvicorn's graceful shutdown "
                              f"({GATEWAY_SHUTDOWN_GRACE_S:g} s) + {GRACE_MARGIN_S:g} s")
        annotations: dict[str, str] = {}
        if (self.ctx.v.get("metrics") or {}).get("scrape", True):
            annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                           "prometheus.io/path": "/metrics"}
        extra: Obj = {"terminationGracePeriodSeconds": grace, **self.ctx.identity(container, "gateway", "gateway")}
        for field in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints"):
            if spec.get(field):
                extra[field] = spec[field]
        labels = self.ctx.labels("gateway")
        return {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": self.ctx.meta("gateway", "gateway"),
            "spec": {
                "replicas": int(spec.get("replicas", 2)),
                "selector": {"matchLabels": labels},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
                "template": {"metadata": {"labels": labels, "annotations": annotations},
                             "spec": self.ctx.pod_spec([container], extra=extra)},
            },
        }

    def service(self, spec: Obj) -> Obj:
        service = spec.get("service") or {}
        port = {"name": "http", "port": int(service.get("port") or 80), "targetPort": self.target(spec),
                "protocol": "TCP"}
        out: Obj = {"apiVersion": "v1", "kind": "Service",
                    "metadata": self.ctx.meta("gateway", "gateway", **({"annotations": dict(service["annotations"])}
                                                                   if service.get("annotations") else {})),
                    "spec": {"type": str(service.get("type") or "ClusterIP"), "selector": self.ctx.labels("gateway"),
                             "ports": [port]}}
        return out

    def ingress(self, spec: Obj, ingress: Obj) -> Obj:
        if not ingress.get("host"):
            raise ConfigError("services.gateway.ingress.host: the host name clients use (required with "
                              "services.gateway.ingress.enabled)")
        host = str(ingress["host"])
        backend = {"service": {"name": self.ctx.name("gateway"), "port": {"name": "http"}}}
        body: Obj = {"rules": [{"host": host, "http": {"paths": [{
            "path": str(ingress.get("path") or "/"), "pathType": str(ingress.get("pathType") or "Prefix"),
            "backend": backend}]}}]}
        if ingress.get("className"):
            body = {"ingressClassName": str(ingress["className"]), **body}
        if ingress.get("tlsSecret"):
            body["tls"] = [{"hosts": [host], "secretName": str(ingress["tlsSecret"])}]
        meta = self.ctx.meta("gateway", "gateway")
        if ingress.get("annotations"):
            meta["annotations"] = {str(k): str(v) for k, v in ingress["annotations"].items()}
        return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": body}

    def hpa(self, spec: Obj, scaling: Obj) -> Obj:
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
            "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": self.ctx.meta("gateway", "gateway"),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": self.ctx.name("gateway")},
                "minReplicas": low, "maxReplicas": high, "metrics": [target],
            },
        }
        if scaling.get("behavior"):
            hpa["spec"]["behavior"] = scaling["behavior"]
        return hpa

    def network_policy(self, spec: Obj) -> Obj:
        """The workers' policy admits only the monitoring namespace, to the metrics port; clients (an
        ingress controller, services in the cluster) reach the gateway's port through this one (policies
        add up). ``networkPolicy.gatewayFrom``: NetworkPolicyPeers; empty: from anywhere."""
        rule: Obj = {"ports": [{"protocol": "TCP", "port": self.port(spec)}]}
        peers = (self.ctx.v.get("networkPolicy") or {}).get("gatewayFrom") or []
        if peers:
            rule["from"] = list(peers)
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": self.ctx.meta("gateway", "policy"),
                "spec": {"podSelector": {"matchLabels": self.ctx.labels("gateway")}, "policyTypes": ["Ingress"],
                         "ingress": [rule]}}


def _camel(field: str) -> str:
    head, *rest = field.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _snake(key: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in key)


__all__ = ["GATEWAY_RATE_METRIC", "GATEWAY_REQUESTS_SERIES", "GATEWAY_SETTINGS", "GATEWAY_SHUTDOWN_GRACE_S",
           "GatewayObjects"]
