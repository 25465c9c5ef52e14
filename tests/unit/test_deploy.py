"""`agentstream deploy render`: the manifests as data, checked against the code they deploy."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
import typer
import yaml

from agentstream.cli import app
from agentstream.deploy import gateway, manifests, render, values
from agentstream.services.gateway.metrics import GatewayMetrics
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.telemetry.metrics import Metrics


def _by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


def _named(objects: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _env(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_defaults_render_every_object_for_every_enabled_service():
    objects = manifests.render(values.load())
    kinds = _by_kind(objects)
    deployments = {o["metadata"]["name"] for o in kinds["Deployment"]}
    assert deployments == {"agentstream-planner", "agentstream-tools", "agentstream-retrieval",
                           "agentstream-inference", "agentstream-alerts",
                           "agentstream-gateway"}  # the GPU variant is off by default
    assert {o["metadata"]["name"] for o in kinds["PodDisruptionBudget"]} == deployments
    # KEDA scales the consumers on their lag; the gateway, a consumer of nothing, has an HPA on its requests
    assert {o["spec"]["scaleTargetRef"]["name"] for o in kinds["ScaledObject"]} == deployments - {
        "agentstream-alerts", "agentstream-gateway"}
    assert [o["spec"]["scaleTargetRef"]["name"] for o in kinds["HorizontalPodAutoscaler"]] == ["agentstream-gateway"]
    assert [o["metadata"]["name"] for o in kinds["Service"]] == ["agentstream-gateway"]
    assert "Ingress" not in kinds  # only with services.gateway.ingress.enabled
    assert [o["metadata"]["name"] for o in kinds["ConfigMap"]] == ["agentstream-config"]
    assert [o["metadata"]["name"] for o in kinds["Secret"]] == ["agentstream-secrets"]
    assert [o["spec"]["template"]["spec"]["containers"][0]["args"] for o in kinds["Job"]] == [["migrate"]]
    assert sorted(o["metadata"]["name"] for o in kinds["NetworkPolicy"]) == ["agentstream-gateway",
                                                                               "agentstream-workers"]
    # Configuration before the Job, the Job before the workloads.
    order = [o["kind"] for o in objects]
    assert order.index("ConfigMap") < order.index("Job") < order.index("Deployment")


def test_workers_are_probed_non_root_read_only_and_outlast_the_runtime_grace():
    with pytest.raises(ConfigError, match="shutdown grace"):
        manifests.render(values.load(sets=["services.tools.terminationGracePeriodSeconds=12"]))
    for deployment in _by_kind(manifests.render(values.load()))["Deployment"]:
        pod = deployment["spec"]["template"]["spec"]
        container = pod["containers"][0]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
        assert container["securityContext"]["readOnlyRootFilesystem"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["terminationGracePeriodSeconds"] >= manifests.RUNTIME_SHUTDOWN_GRACE_S + manifests.GRACE_MARGIN_S
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        assert {"name": "state", "mountPath": manifests.STATE_DIR} in container["volumeMounts"]
        if deployment["metadata"]["name"] == "agentstream-alerts":
            assert "readinessProbe" not in container  # a faust worker: no /readyz to probe
            continue
        if deployment["metadata"]["name"] == "agentstream-gateway":
            continue  # probed on its own port: test_the_gateway_is_a_probed_deployment_behind_a_service
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["ports"] == [{"name": "metrics", "containerPort": 9464}]
        assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9464"
        strategy = deployment["spec"]["strategy"]["rollingUpdate"]
        assert strategy == {"maxSurge": 1, "maxUnavailable": 0}


def test_scaling_follows_the_groups_and_the_backlog_the_code_exports():
    objects = manifests.render(values.load(sets=["kafka.topicPrefix=prod.", "kafka.partitions=6"]))
    topics = Topics(prefix="prod.", partitions=6)
    scaled = {o["metadata"]["name"]: o["spec"] for o in _by_kind(objects)["ScaledObject"]}
    for service in ("planner", "tools", "retrieval"):
        trigger = scaled[f"agentstream-{service}"]["triggers"][0]
        assert trigger["type"] == "kafka"
        assert trigger["metadata"]["consumerGroup"] == topics.group(service)
        assert scaled[f"agentstream-{service}"]["maxReplicaCount"] <= 6  # no idle consumers
    assert scaled["agentstream-planner"]["minReplicaCount"] >= 1  # deadlines and the sweeper live there
    assert scaled["agentstream-tools"]["minReplicaCount"] == 0
    inference = scaled["agentstream-inference"]
    assert inference["minReplicaCount"] == 0 and inference["triggers"][0]["type"] == "prometheus"
    exported = {m.name for m in Metrics().registry.collect()}
    assert "agentstream_inference_backlog_prompt_tokens" in exported
    assert "agentstream_inference_backlog_prompt_tokens" in inference["triggers"][0]["metadata"]["query"]
    config = _named(objects, "ConfigMap", "agentstream-config")["data"]
    assert (config["AGENTSTREAM_TOPIC_PREFIX"], config["AGENTSTREAM_PARTITIONS"]) == ("prod.", "6")


def test_every_rendered_command_line_is_one_the_cli_accepts():
    """The args a Deployment gives the image must parse: a renamed option would crash-loop every pod."""
    command = typer.main.get_command(app)
    sets = ["services.inferenceGpu.enabled=true", "services.tools.toolModules=[my.tools]",
            "services.inference.backend=openai", "services.inference.model=qwen",
            "services.inference.baseUrl=http://m:8000/v1", "services.inference.slots=8",
            "services.inferenceGpu.maxSeqLen=32768", "services.inferenceGpu.maxNumTokens=8192",
            "services.inferenceGpu.chunkedPrefill=false"]
    objects = manifests.render(values.load(sets=sets))
    lines = [o["spec"]["template"]["spec"]["containers"][0]["args"] for o in objects
             if o["kind"] in ("Deployment", "Job")]
    assert ["worker", "tools", "--tools", "my.tools"] in lines
    assert ["worker", "inference", "--backend", "trtllm", "--model", "Qwen/Qwen2.5-7B-Instruct", "--slots", "64",
            "--max-seq-len", "32768", "--max-num-tokens", "8192", "--no-chunked-prefill"] in lines
    for args in lines:
        ctx = command.make_context("agentstream", list(args), resilient_parsing=True)
        sub = command.get_command(ctx, args[0])
        assert sub is not None, args
        sub.make_context(args[0], list(args[1:]))  # raises on an unknown option


def test_the_gpu_variant_asks_for_a_gpu_and_its_own_image():
    objects = manifests.render(values.load(sets=["services.inferenceGpu.enabled=true"]))
    gpu = _named(objects, "Deployment", "agentstream-inference-gpu")["spec"]["template"]["spec"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["containers"][0]["image"] == "localhost/agentstream-gpu:dev"
    assert gpu["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_secret_holds_the_database_url_and_an_existing_one_is_referenced_instead():
    objects = manifests.render(values.load(sets=["database.url=postgresql://u:pw@db:5432/x"]))
    secret = _named(objects, "Secret", "agentstream-secrets")
    assert base64.b64decode(secret["data"]["DATABASE_URL"]).decode() == "postgresql://u:pw@db:5432/x"
    config = _named(objects, "ConfigMap", "agentstream-config")["data"]
    assert "pw" not in yaml.safe_dump(config)
    mine = manifests.render(values.load(sets=["existingSecret=my-secrets"]))
    assert not [o for o in mine if o["kind"] == "Secret"]
    refs = _named(mine, "Deployment", "agentstream-planner")["spec"]["template"]["spec"]["containers"][0]["envFrom"]
    assert {"secretRef": {"name": "my-secrets"}} in refs


def test_podman_values_put_pods_on_the_host_network_without_fixed_ports():
    path = values.defaults_file().parent / "values-podman.yaml"
    objects = manifests.render(values.load([path]))
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    names = {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"}
    assert names == {"agentstream-planner", "agentstream-tools", "agentstream-inference", "agentstream-gateway"}
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True
        if deployment["metadata"]["name"] == "agentstream-gateway":
            continue
        assert "readinessProbe" not in pod["containers"][0] and "ports" not in pod["containers"][0]
    # The gateway: one replica on a fixed port of this host's loopback (its probes can name it).
    gateway = _named(objects, "Deployment", "agentstream-gateway")
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert gateway["spec"]["replicas"] == 1
    assert _env(container)["AGENTSTREAM_GATEWAY_HOST"] == "127.0.0.1"
    assert _env(container)["AGENTSTREAM_GATEWAY_PORT"] == "8080"
    # no port mapping on the host's network (podman refuses one): the probes name the port's number
    assert "ports" not in container and container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": 8080}
    assert "lifecycle" not in container  # no load balancer to leave on one host
    assert _named(objects, "ConfigMap", "agentstream-config")["data"]["AGENTSTREAM_METRICS_PORT"] == "0"
    # the host's network: loopback, not every interface of the host
    assert _named(objects, "ConfigMap", "agentstream-config")["data"]["AGENTSTREAM_METRICS_HOST"] == "127.0.0.1"


def test_pods_bind_metrics_on_all_their_interfaces_as_the_image_does():
    """A worker alone binds 127.0.0.1; in a pod the kubelet's probes and Prometheus come in through the
    pod's IP, so the rendering says 0.0.0.0, and so do both images (a published port arrives there)."""
    config = _named(manifests.render(values.load()), "ConfigMap", "agentstream-config")["data"]
    assert config["AGENTSTREAM_METRICS_HOST"] == "0.0.0.0"
    mine = manifests.render(values.load(sets=["metrics.host=10.0.0.5"]))
    assert _named(mine, "ConfigMap", "agentstream-config")["data"]["AGENTSTREAM_METRICS_HOST"] == "10.0.0.5"
    root = Path(__file__).resolve().parents[2]
    for containerfile in (root / "Containerfile", root / "infra" / "container" / "Containerfile.gpu"):
        assert "AGENTSTREAM_METRICS_HOST=0.0.0.0" in containerfile.read_text(), containerfile


def test_values_merge_maps_and_replace_lists(tmp_path):
    base = {"a": {"b": 1, "c": [1, 2]}, "d": 1}
    assert values.merge(base, {"a": {"c": [3]}, "e": 2}) == {"a": {"b": 1, "c": [3]}, "d": 1, "e": 2}
    assert values.parse_set("a.b.c=3") == {"a": {"b": {"c": 3}}}
    assert values.parse_set("hostNetwork=true") == {"hostNetwork": True}
    with pytest.raises(ConfigError):
        values.parse_set("novalue")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        values.load([bad])


def test_a_kustomize_base_lists_every_file(tmp_path):
    objects = manifests.render(values.load())
    written = render.write_base(objects, tmp_path)
    kustomization = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in written if p.name != "kustomization.yaml")
    assert len(kustomization["resources"]) == len(objects)
    again = [yaml.safe_load(p.read_text()) for p in written if p.name != "kustomization.yaml"]
    assert again == objects
    assert list(yaml.safe_load_all(render.to_yaml(objects))) == objects


def test_with_sasl_each_service_authenticates_as_itself_with_a_mounted_password_file():
    v = values.load()
    v["kafka"]["sasl"] = {"securityProtocol": "SASL_SSL", "secretPrefix": "kc-"}
    objects = manifests.render(v)
    config = _named(objects, "ConfigMap", "agentstream-config")["data"]
    assert (config["AGENTSTREAM_KAFKA_SECURITY_PROTOCOL"], config["AGENTSTREAM_KAFKA_SASL_MECHANISM"]) == (
        "SASL_SSL", "SCRAM-SHA-512")
    for name, principal in (("agentstream-tools", "tools"), ("agentstream-planner", "planner"),
                            ("agentstream-alerts", "alerts"), ("agentstream-migrate", "admin"),
                            ("agentstream-gateway", "gateway")):
        kind = "Job" if name.endswith("migrate") else "Deployment"
        pod = _named(objects, kind, name)["spec"]["template"]["spec"]
        container = pod["containers"][0]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert env["AGENTSTREAM_KAFKA_USERNAME"] == principal
        assert env["AGENTSTREAM_KAFKA_PASSWORD_FILE"] == f"{manifests.KAFKA_SECRET_DIR}/password"
        assert not any("PASSWORD" in k and k != "AGENTSTREAM_KAFKA_PASSWORD_FILE" for k in env)
        [volume] = [v for v in pod["volumes"] if v["name"] == "kafka-credentials"]
        assert volume["secret"]["secretName"] == f"kc-{principal}"
        assert {"name": "kafka-credentials", "mountPath": manifests.KAFKA_SECRET_DIR, "readOnly": True} in \
            container["volumeMounts"]
    plain = manifests.render(values.load())
    assert "AGENTSTREAM_KAFKA_SECURITY_PROTOCOL" not in _named(plain, "ConfigMap", "agentstream-config")["data"]


# -- the HTTP gateway -----------------------------------------------------------------------------------

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _gateway_objects(*sets: str) -> dict[str, dict]:
    return {o["kind"]: o for o in manifests.render(values.load(sets=list(sets)))
            if o["metadata"]["name"] == "agentstream-gateway"}


def test_the_gateway_is_a_probed_deployment_behind_a_service():
    objects = _gateway_objects("services.gateway.replicas=3", "services.gateway.port=9000",
                               "services.gateway.service.port=8443")
    assert set(objects) == {"Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy"}
    for obj in objects.values():  # the shapes the API server checks first
        assert obj["apiVersion"] and DNS_LABEL.match(obj["metadata"]["name"]) and len(obj["metadata"]["name"]) <= 63
        assert obj["metadata"]["namespace"] == "agentstream"
    deployment = objects["Deployment"]
    assert deployment["apiVersion"] == "apps/v1" and deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    container = pod["spec"]["containers"][0]
    assert container["args"] == ["worker", "gateway"]
    assert container["ports"] == [{"name": "http", "containerPort": 9000}]
    assert (container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]) == (
        {"path": "/healthz", "port": "http"}, {"path": "/readyz", "port": "http"})
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    env = _env(container)
    assert (env["AGENTSTREAM_GATEWAY_HOST"], env["AGENTSTREAM_GATEWAY_PORT"]) == ("0.0.0.0", "9000")
    assert env["OTEL_SERVICE_NAME"] == "agentstream-gateway"
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["spec"]["securityContext"]["runAsNonRoot"]
    assert {"configMapRef": {"name": "agentstream-config"}} in container["envFrom"]  # the broker, the database
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9000"  # /metrics is on the API's port
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 5 + gateway.GATEWAY_SHUTDOWN_GRACE_S
    service = objects["Service"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["ports"] == [{"name": "http", "port": 8443, "targetPort": "http", "protocol": "TCP"}]
    policy = objects["NetworkPolicy"]["spec"]
    assert policy["podSelector"]["matchLabels"] == pod["metadata"]["labels"]
    assert policy["ingress"] == [{"ports": [{"protocol": "TCP", "port": 9000}]}]  # from anyone: tokens guard it
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]
    v = values.load(sets=["services.gateway.enabled=true"])
    v["networkPolicy"]["gatewayFrom"] = peers
    mine = _named(manifests.render(v), "NetworkPolicy", "agentstream-gateway")
    assert mine["spec"]["ingress"][0]["from"] == peers
    assert not _gateway_objects("services.gateway.enabled=false")
    with pytest.raises(ConfigError, match="uvicorn"):
        manifests.render(values.load(sets=["services.gateway.terminationGracePeriodSeconds=8"]))
    with pytest.raises(ConfigError, match="port"):
        manifests.render(values.load(sets=["services.gateway.port=70000"]))


def test_the_gateway_autoscales_on_its_request_rate_or_on_cpu():
    hpa = _gateway_objects("services.gateway.autoscaling.requestsPerSecond=40",
                           "services.gateway.autoscaling.minReplicas=3",
                           "services.gateway.autoscaling.maxReplicas=12")["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "agentstream-gateway"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 12)
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": gateway.GATEWAY_RATE_METRIC},
        "target": {"type": "AverageValue", "averageValue": "40"}}}]
    assert "behavior" not in hpa["spec"]
    cpu = _gateway_objects("services.gateway.autoscaling.metric=cpu", "services.gateway.autoscaling.cpuUtilization=60",
                           "services.gateway.autoscaling.behavior={scaleDown: {stabilizationWindowSeconds: 600}}"
                           )["HorizontalPodAutoscaler"]["spec"]
    assert cpu["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}]
    assert cpu["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 600}}
    v = values.load(sets=["services.gateway.autoscaling.metric=cpu"])
    v["services"]["gateway"]["resources"] = {"limits": {"memory": "1Gi"}}  # (--set merges maps: replaced here)
    with pytest.raises(ConfigError, match=r"requests\.cpu"):
        manifests.render(v)
    with pytest.raises(ConfigError, match="requests or cpu"):
        manifests.render(values.load(sets=["services.gateway.autoscaling.metric=latency"]))
    with pytest.raises(ConfigError, match="minReplicas"):
        manifests.render(values.load(sets=["services.gateway.autoscaling.minReplicas=5",
                                           "services.gateway.autoscaling.maxReplicas=2"]))
    assert "HorizontalPodAutoscaler" not in _gateway_objects("services.gateway.autoscaling.enabled=false")


def test_the_rate_the_hpa_reads_is_the_gateways_counter_through_the_documented_adapter_rule():
    """The Pods metric is the Prometheus adapter's name for the rate of a counter the gateway exports;
    the rule in docs/deploy.md turns the one into the other."""
    metrics = GatewayMetrics(streams_open=lambda: 0, in_flight=lambda: 0)
    samples = {s.name for family in metrics.registry.collect() for s in family.samples}
    assert gateway.GATEWAY_REQUESTS_SERIES in samples
    docs = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", docs, re.S) if "seriesQuery" in b]
    [rule] = yaml.safe_load(block)["rules"]["custom"]
    assert rule["seriesQuery"].startswith(gateway.GATEWAY_REQUESTS_SERIES + "{")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    renamed = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), gateway.GATEWAY_REQUESTS_SERIES)
    assert renamed == gateway.GATEWAY_RATE_METRIC
    assert "rate(<<.Series>>" in rule["metricsQuery"]
    # …and the scrape configuration gives every series the namespace and pod labels the rule maps
    k8s = yaml.safe_load((Path(__file__).resolve().parents[2] / "infra" / "prometheus" / "prometheus-k8s.yml").read_text())
    labels = {r.get("target_label") for r in k8s["scrape_configs"][0]["relabel_configs"]}
    assert {"namespace", "pod"} <= labels


def test_the_gateway_settings_are_the_variables_the_gateway_reads(monkeypatch):
    given = {"ratePerS": 7.5, "burst": 9, "maxInFlight": 11, "maxStreams": 13, "streamQueue": 17, "keepaliveS": 3.0,
             "maxBodyBytes": 2048, "authCacheS": 5.0, "agents": ["a1", "a2"], "defaultTenant": "acme",
             "chatMaxSteps": 4, "chatDeadlineS": 60.0, "unknownRunWaitS": 1.5, "historyEvents": 1000, "historyS": 30.0}
    assert {gateway._snake(k) for k in given} == set(gateway.GATEWAY_SETTINGS)  # every setting is tried
    v = values.load()
    v["services"]["gateway"]["settings"] = given
    container = _named(manifests.render(v), "Deployment", "agentstream-gateway")["spec"]["template"]["spec"]["containers"][0]
    for name, value in _env(container).items():
        if name.startswith("AGENTSTREAM_GATEWAY_"):
            monkeypatch.setenv(name, str(value))
    loaded = GatewaySettings.load()
    for key, value in given.items():
        assert getattr(loaded, gateway._snake(key)) == (tuple(value) if isinstance(value, list) else value), key
    assert (loaded.host, loaded.port) == ("0.0.0.0", 8080)
    with pytest.raises(ConfigError, match="not a gateway setting"):
        manifests.render(values.load(sets=["services.gateway.settings.ratePerSecond=5"]))


def test_the_gateway_ingress_honours_host_path_class_and_tls():
    assert "Ingress" not in _gateway_objects()
    with pytest.raises(ConfigError, match=r"ingress\.host"):
        manifests.render(values.load(sets=["services.gateway.ingress.enabled=true"]))
    ingress = _gateway_objects(
        "services.gateway.ingress.enabled=true", "services.gateway.ingress.host=agents.example.com",
        "services.gateway.ingress.path=/agents", "services.gateway.ingress.className=nginx",
        "services.gateway.ingress.tlsSecret=agents-tls",
        'services.gateway.ingress.annotations={nginx.ingress.kubernetes.io/proxy-read-timeout: "3600"}')["Ingress"]
    assert ingress["apiVersion"] == "networking.k8s.io/v1"
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": ["agents.example.com"], "secretName": "agents-tls"}]
    [rule] = spec["rules"]
    assert rule["host"] == "agents.example.com"
    assert rule["http"]["paths"] == [{"path": "/agents", "pathType": "Prefix", "backend": {
        "service": {"name": "agentstream-gateway", "port": {"name": "http"}}}}]
    assert ingress["metadata"]["annotations"] == {"nginx.ingress.kubernetes.io/proxy-read-timeout": "3600"}
    plain = _gateway_objects("services.gateway.ingress.enabled=true", "services.gateway.ingress.host=a.example")["Ingress"]
    assert "tls" not in plain["spec"] and "ingressClassName" not in plain["spec"]


def test_the_gateway_can_use_its_own_database_login_and_shuts_down_within_its_grace():
    from agentstream.services.gateway.server import server
    from agentstream.streams.config.settings import Settings

    deployment = _gateway_objects("services.gateway.databaseSecret=agentstream-gateway-db")["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    [url] = [e for e in container["env"] if e["name"] == "DATABASE_URL"]  # wins over the shared Secret's
    assert url["valueFrom"] == {"secretKeyRef": {"name": "agentstream-gateway-db", "key": "DATABASE_URL"}}
    shared = _gateway_objects()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert "DATABASE_URL" not in _env(shared)
    settings = Settings(kafka_bootstrap="127.0.0.1:1", database_url="postgresql://nobody@127.0.0.1:1/none")
    uvicorn_server = server(settings, GatewaySettings())
    assert uvicorn_server.config.timeout_graceful_shutdown == gateway.GATEWAY_SHUTDOWN_GRACE_S
