"""`agentstream deploy render`: the manifests as data, checked against the code they deploy."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import typer
import yaml

from agentstream.cli import app
from agentstream.deploy import manifests, render, values
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


def test_defaults_render_every_object_for_every_enabled_service():
    objects = manifests.render(values.load())
    kinds = _by_kind(objects)
    deployments = {o["metadata"]["name"] for o in kinds["Deployment"]}
    assert deployments == {"agentstream-planner", "agentstream-tools", "agentstream-retrieval",
                           "agentstream-inference", "agentstream-alerts"}  # the GPU variant is off by default
    assert {o["metadata"]["name"] for o in kinds["PodDisruptionBudget"]} == deployments
    assert {o["spec"]["scaleTargetRef"]["name"] for o in kinds["ScaledObject"]} == deployments - {"agentstream-alerts"}
    assert [o["metadata"]["name"] for o in kinds["ConfigMap"]] == ["agentstream-config"]
    assert [o["metadata"]["name"] for o in kinds["Secret"]] == ["agentstream-secrets"]
    assert [o["spec"]["template"]["spec"]["containers"][0]["args"] for o in kinds["Job"]] == [["migrate"]]
    assert len(kinds["NetworkPolicy"]) == 1
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
    assert names == {"agentstream-planner", "agentstream-tools", "agentstream-inference"}
    for deployment in (o for o in objects if o["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["hostNetwork"] is True
        assert "readinessProbe" not in pod["containers"][0] and "ports" not in pod["containers"][0]
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
                            ("agentstream-alerts", "alerts"), ("agentstream-migrate", "admin")):
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
