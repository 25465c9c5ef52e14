"""`agentstream deploy render` with `security.enabled` and tenant cells: who each pod is, where its
passwords are (files, never environment values or arguments), the setup Jobs, and each cell's quotas."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
import typer

from agentstream.cli import app
from agentstream.deploy import cells, credentials, manifests, values
from agentstream.deploy.podman import KubePlay
from agentstream.deploy.setup import CellRef
from agentstream.devstack.secure import DATABASE_LOGINS
from agentstream.ops.acls import ADMIN, PRINCIPALS
from agentstream.ops.client_quotas import DEFAULT_PRODUCER_BYTE_RATE
from agentstream.streams.config.identity import env_database_url
from agentstream.streams.core.errors import ConfigError

TENANTS = ("tenants=[{name: acme, quotas: {runsInFlight: 2, maxSteps: 6, tokensPerRun: 2000, tokensPerHour: 9000, "
           "tokensPerDay: 50000, tasksPerSecond: 0.5}, producerByteRate: 4096, services: {tools: {replicas: 3}}}, "
           "{name: beta, prefix: b., principal: team-b, producerByteRate: 0}]")
SECURE = ["security.enabled=true", "database.url=postgresql://owner:owner-pw@db:5432/agentstream", TENANTS]


def _render(*sets: str) -> list[dict]:
    return manifests.render(values.load(sets=[*SECURE, *sets]))


def _named(objects: list[dict], kind: str, name: str) -> dict:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _pods(objects: list[dict]) -> dict[str, dict]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "Job")}


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def _passwords(objects: list[dict]) -> set[str]:
    return {base64.b64decode(o["data"]["password"]).decode() for o in objects
            if o["kind"] == "Secret" and "password" in o.get("data", {})}


def test_no_password_is_in_any_environment_value_argument_or_configmap():
    objects = _render()
    passwords = _passwords(objects)
    assert "owner-pw" in passwords and len(passwords) > 20
    config = _named(objects, "ConfigMap", "agentstream-config")["data"]
    shared = _named(objects, "Secret", "agentstream-secrets")["data"]
    assert "DATABASE_URL" not in shared  # (the owner's URL for every pod: only without security)
    exposed = [*config.values()]
    for pod in _pods(objects).values():
        for container in pod["containers"]:
            exposed += [*container.get("args", []), *container.get("command", []), *_env(container).values()]
            assert not [e for e in container.get("env", []) if "valueFrom" in e and "secretKeyRef" in e["valueFrom"]]
            assert not [n for n in _env(container) if "PASSWORD" in n and not n.endswith("_PASSWORD_FILE")]
    text = "\n".join(str(v) for v in exposed)
    assert [p for p in passwords if p in text] == []


def test_every_service_is_its_own_principal_and_login_with_a_secret_each():
    objects = _render()
    secrets = {o["metadata"]["name"] for o in objects if o["kind"] == "Secret"}
    seen: dict[str, tuple[str, str]] = {}
    for name, pod in _pods(objects).items():
        if name.endswith("-kafka-config"):
            continue  # Kafka's own tool: the admin's client.properties (below)
        [container] = pod["containers"]
        env = _env(container)
        volumes = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert env["AGENTSTREAM_KAFKA_PASSWORD_FILE"] == f"{credentials.KAFKA_SECRET_DIR}/password"
        assert volumes["kafka-credentials"] == f"agentstream-kafka-{env['AGENTSTREAM_KAFKA_USERNAME']}"
        login = None
        if not name.endswith("alerts"):  # (the alerting app uses no database)
            login = env["DATABASE_URL"].split("//")[1].split("@")[0]
            assert ":" not in login  # the URL names the login, its password is a file
            assert env["DATABASE_URL"] == f"postgresql://{login}@db:5432/agentstream"
            assert env["AGENTSTREAM_DATABASE_PASSWORD_FILE"] == f"{credentials.DATABASE_SECRET_DIR}/password"
            assert volumes["db-credentials"] == f"agentstream-db-{login}"
        assert set(volumes.values()) <= secrets, name
        seen[name] = (env["AGENTSTREAM_KAFKA_USERNAME"], login or "")
    for service in ("planner", "tools", "retrieval", "inference", "gateway"):
        assert seen[f"agentstream-{service}"] == (service, service)
        if service != "gateway":  # (one gateway for every cell)
            assert seen[f"agentstream-acme-{service}"] == (service, service)  # a cell's services: the same ones
    assert seen["agentstream-alerts"] == ("alerts", "")
    assert seen["agentstream-migrate"] == seen["agentstream-setup"] == (ADMIN, "owner")
    # a Secret for every principal and login there is, not only those a pod uses
    assert {f"agentstream-kafka-{p}" for p in (ADMIN, *PRINCIPALS, "tenant-acme", "team-b")} <= secrets
    logins = {login for login, roles in DATABASE_LOGINS.items() if roles} | {
        "owner", "tenant-acme", "approver-acme", "team-b", "approver-beta"}
    assert {f"agentstream-db-{login}" for login in logins} <= secrets


def test_each_cells_planners_carry_its_quotas_and_its_prefix():
    objects = _render()
    pods = _pods(objects)
    acme = _env(pods["agentstream-acme-planner"]["containers"][0])
    assert {k: v for k, v in acme.items() if k.startswith("AGENTSTREAM_QUOTA_")} == {
        "AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT": "2", "AGENTSTREAM_QUOTA_MAX_STEPS": "6",
        "AGENTSTREAM_QUOTA_TOKENS_PER_RUN": "2000", "AGENTSTREAM_QUOTA_TOKENS_PER_HOUR": "9000",
        "AGENTSTREAM_QUOTA_TOKENS_PER_DAY": "50000", "AGENTSTREAM_QUOTA_TASKS_PER_SECOND": "0.5"}
    configs = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    assert {k: v["AGENTSTREAM_TOPIC_PREFIX"] for k, v in configs.items()} == {
        "agentstream-config": "", "agentstream-acme-config": "acme.", "agentstream-beta-config": "b."}
    for name, pod in pods.items():  # quotas on a cell's planners only; each cell's prefix from its ConfigMap
        [container] = pod["containers"]
        if name != "agentstream-acme-planner":
            assert not [k for k in _env(container) if k.startswith("AGENTSTREAM_QUOTA_")], name
        assert "AGENTSTREAM_TOPIC_PREFIX" not in _env(container)  # (podman would let the ConfigMap's win)
        cell = next((c for c in ("acme", "beta") if name.startswith(f"agentstream-{c}-")), None)
        refs = [r["configMapRef"]["name"] for r in container.get("envFrom", []) if "configMapRef" in r]
        if not name.endswith("kafka-config"):
            assert refs == [f"agentstream-{cell}-config" if cell else "agentstream-config"], name
    tools = _named(objects, "Deployment", "agentstream-acme-tools")
    assert tools["spec"]["replicas"] == 3  # the cell's services' values over the installation's
    assert _named(objects, "Deployment", "agentstream-beta-tools")["spec"]["replicas"] == 2
    scaled = _named(objects, "ScaledObject", "agentstream-acme-planner")
    assert scaled["spec"]["triggers"][0]["metadata"]["consumerGroup"] == "acme.agentstream.planner"
    assert _named(objects, "PodDisruptionBudget", "agentstream-beta-tools")


def test_the_setup_jobs_create_each_cell_and_its_produce_quota():
    objects = _render()
    pods = _pods(objects)
    [setup] = pods["agentstream-setup"]["containers"]
    assert setup["args"] == ["deploy", "setup", "--passwords", credentials.SETUP_DATABASE_DIR,
                             "--cell", "acme=acme.=tenant-acme", "--cell", "beta=b.=team-b"]
    mounted = {m["mountPath"] for m in setup["volumeMounts"]}
    assert {f"{credentials.SETUP_DATABASE_DIR}/{login}" for login in ("planner", "tenant-acme", "team-b")} <= mounted
    command = typer.main.get_command(app)  # the Job's command line parses with the real CLI
    ctx = command.make_context("agentstream", list(setup["args"]), resilient_parsing=True)
    deploy = command.get_command(ctx, "deploy")
    sub = deploy.get_command(ctx, "setup")  # type: ignore[union-attr]
    sub.make_context("setup", list(setup["args"][2:]))  # type: ignore[union-attr]
    [config] = pods["agentstream-kafka-config"]["containers"]
    script = config["args"][1]
    assert config["image"] == "docker.io/apache/kafka:4.0.2" and config["command"] == ["sh"]
    assert "--add-config producer_byte_rate=4096" in script and "--entity-name tenant-acme" in script
    assert "--delete-config" not in script  # (refused by kafka-configs where the broker has no such entry)
    assert not [line for line in script.splitlines() if "--entity-name team-b" in line and "producer" in line]
    for principal in (*PRINCIPALS, "tenant-acme", "team-b"):  # a SCRAM credential from each password file
        assert f'"$(cat "$dir/{principal}/password")"' in script
    assert cells.Cell.of({"name": "x"}, 0).producer_byte_rate == DEFAULT_PRODUCER_BYTE_RATE  # as `dev up`'s


def test_given_passwords_are_used_and_the_admin_client_config_holds_its_own():
    objects = _render("security.passwords={kafka: {admin: adm1n, planner: pl4nner}, database: {planner: db-pl4n}}")
    data = {o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o["data"].items()}
            for o in objects if o["kind"] == "Secret"}
    assert data["agentstream-kafka-planner"]["password"] == "pl4nner"
    assert data["agentstream-db-planner"]["password"] == "db-pl4n"
    assert data["agentstream-db-owner"]["password"] == "owner-pw"  # database.url's
    assert 'username="admin" password="adm1n";' in data["agentstream-kafka-admin"][credentials.CLIENT_PROPERTIES]
    assert not [o for o in _render("security.existingSecrets=true")
                if o["kind"] == "Secret" and o["metadata"]["name"] != "agentstream-secrets"]


@pytest.mark.parametrize(("sets", "message"), [
    (["tenants=[{name: acme}]"], "tenants need security.enabled"),
    ([*SECURE, "tenants=[{name: acme, quotas: {tokensPerWeek: 1}}]"], "not a quota"),
    ([*SECURE, "tenants=[{name: acme, quotas: {maxSteps: -1}}]"], "a positive number"),
    ([*SECURE, "tenants=[{name: Acme}]"], "lower-case"),
    ([*SECURE, "tenants=[{name: a}, {name: b, prefix: a.}]"], "same prefix"),
])
def test_bad_cells_are_refused_when_rendering(sets, message):
    with pytest.raises(ConfigError, match=message):
        manifests.render(values.load(sets=sets))


def test_a_cell_on_the_command_line_is_name_prefix_principal():
    assert CellRef.parse("acme=acme.=tenant-acme") == CellRef("acme", "acme.", "tenant-acme")
    with pytest.raises(ConfigError):
        CellRef.parse("acme=acme.")


def test_a_process_reads_its_database_password_from_the_file_the_url_names_no_password(tmp_path, monkeypatch):
    secret = tmp_path / "password"
    secret.write_text("p@ss:w/rd\n")
    monkeypatch.setenv("DATABASE_URL", "postgresql://planner@db:5432/agentstream?sslmode=require")
    monkeypatch.setenv("AGENTSTREAM_DATABASE_PASSWORD_FILE", str(secret))
    assert env_database_url() == "postgresql://planner:p%40ss%3Aw%2Frd@db:5432/agentstream?sslmode=require"
    monkeypatch.delenv("AGENTSTREAM_DATABASE_PASSWORD_FILE")
    assert env_database_url() == "postgresql://planner@db:5432/agentstream?sslmode=require"
    monkeypatch.setenv("AGENTSTREAM_DATABASE_PASSWORD_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="AGENTSTREAM_DATABASE_PASSWORD_FILE"):
        env_database_url()


def test_podman_plays_secret_volumes_as_the_hosts_files_owned_by_the_pods_user(tmp_path):
    objects = _render()
    deployment = KubePlay(objects, tmp_path)
    played = deployment._played(_named(objects, "Deployment", "agentstream-acme-planner"))
    volumes = {v["name"]: v for v in played["spec"]["template"]["spec"]["volumes"]}
    assert not [v for v in volumes.values() if "secret" in v]
    password = Path(volumes["db-credentials"]["hostPath"]["path"]) / "password"
    assert password.read_text() in _passwords(objects)
    assert password.stat().st_mode & 0o777 == 0o400
    if os.getuid() == 0:
        assert password.stat().st_uid == 10001
    assert deployment.env_secrets == {"agentstream-secrets"}  # only it becomes a podman secret
    deployment.remove_secret_files()  # (what down() ends with)
    assert not password.exists()
