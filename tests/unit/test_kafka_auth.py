"""Kafka credentials (streams/config/kafka_auth.py, identity.load_kafka_auth), the local stack's secrets and the
ACLs derived from the topic contract (agentstream/ops/acls.py). The broker's enforcement of them is tested in
tests/integration/test_secure_stack.py."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from agentstream.devstack.secure import StackSecrets
from agentstream.ops.acls import PRINCIPALS, SERVICES, Operation, Pattern, Resource, acl_bindings
from agentstream.streams.config.identity import Identity, load_kafka_auth
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import StackPaths, read_state, write_state
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.kafka.topics import Topics

_ENV = ("AGENTSTREAM_KAFKA_SECURITY_PROTOCOL", "AGENTSTREAM_KAFKA_SASL_MECHANISM", "AGENTSTREAM_KAFKA_USERNAME",
        "AGENTSTREAM_KAFKA_PASSWORD_FILE", "AGENTSTREAM_KAFKA_PASSWORD", "AGENTSTREAM_KAFKA_SSL_CAFILE",
        "KAFKA_BOOTSTRAP_SERVERS")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTSTREAM_STATE_DIR", str(tmp_path / "state"))


def test_plaintext_by_default_adds_no_options():
    auth = load_kafka_auth({})
    assert auth == KafkaAuth() and not auth.sasl and auth.options() == {}
    assert kafka_options("h:1", auth) == {"bootstrap_servers": "h:1"}


def test_credentials_from_a_password_file(monkeypatch, tmp_path):
    secret = tmp_path / "planner.password"
    secret.write_text("s3cret-value\n")
    monkeypatch.setenv("AGENTSTREAM_KAFKA_USERNAME", "planner")
    monkeypatch.setenv("AGENTSTREAM_KAFKA_PASSWORD_FILE", str(secret))
    auth = load_kafka_auth({})
    assert (auth.security_protocol, auth.sasl_mechanism, auth.principal) == ("SASL_PLAINTEXT", "SCRAM-SHA-512",
                                                                             "User:planner")
    assert auth.options() == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                              "sasl_plain_username": "planner", "sasl_plain_password": "s3cret-value"}
    assert "s3cret" not in repr(auth)
    settings = Settings(kafka_bootstrap="h:1", database_url="postgresql://u:pw@h/db", kafka_auth=auth)
    assert "s3cret" not in repr(settings) and "pw@" not in repr(settings)


def test_missing_or_empty_secrets_are_clear_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTSTREAM_KAFKA_USERNAME", "planner")
    with pytest.raises(ConfigError, match="needs a user name and a password"):
        load_kafka_auth({})
    monkeypatch.setenv("AGENTSTREAM_KAFKA_PASSWORD_FILE", str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="cannot read AGENTSTREAM_KAFKA_PASSWORD_FILE"):
        load_kafka_auth({})
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("AGENTSTREAM_KAFKA_PASSWORD_FILE", str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="is empty"):
        load_kafka_auth({})
    monkeypatch.delenv("AGENTSTREAM_KAFKA_PASSWORD_FILE")
    monkeypatch.setenv("AGENTSTREAM_KAFKA_PASSWORD", "x")
    monkeypatch.setenv("AGENTSTREAM_KAFKA_SECURITY_PROTOCOL", "SSL_MAYBE")
    with pytest.raises(ConfigError, match="security protocol"):
        load_kafka_auth({})


def test_the_local_secure_stack_gives_each_process_its_own_principal(tmp_path):
    secrets = StackSecrets.ensure(tmp_path / "secrets")
    paths = StackPaths.from_env()
    paths.state_dir.mkdir(parents=True)
    write_state(paths.state_file, {"kafka_security": "SASL_PLAINTEXT", "secrets_dir": str(secrets.directory)})
    assert Settings.load().kafka_auth.username == "client"
    tools = Identity(principal="tools")
    settings = Settings.load(identity=tools)
    auth = settings.kafka_auth
    assert (auth.username, auth.password) == ("tools", secrets.password("tools"))
    assert settings.identity == tools and load_kafka_auth(read_state(paths.state_file), identity=tools) == auth
    assert settings.kafka_options() == kafka_options(settings.kafka_bootstrap, auth)


def test_a_user_cluster_named_in_the_environment_ignores_the_local_stack_secrets(monkeypatch, tmp_path):
    secrets = StackSecrets.ensure(tmp_path / "secrets")
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "kafka.example:9092")
    assert load_kafka_auth({"kafka_security": "SASL_PLAINTEXT", "secrets_dir": str(secrets.directory)},
                           external=True) == KafkaAuth()


def test_secrets_are_private_random_and_kept(tmp_path):
    first = StackSecrets.ensure(tmp_path / "secrets")
    passwords = {name: first.password(name) for name in ("admin", *PRINCIPALS)}
    assert len(set(passwords.values())) == len(passwords)
    assert (tmp_path / "secrets").stat().st_mode & 0o077 == 0
    assert all(first.path(name).stat().st_mode & 0o077 == 0 for name in passwords)
    again = StackSecrets.ensure(tmp_path / "secrets")
    assert {name: again.password(name) for name in passwords} == passwords


def test_scram_credentials_for_the_broker_are_salted_hashes_not_passwords(tmp_path):
    secrets = StackSecrets.ensure(tmp_path / "secrets")
    args = secrets.scram_arguments()
    text = " ".join(args)
    assert not any(secrets.password(name) in text for name in ("admin", *PRINCIPALS))
    planner = next(a for a in args if "name=planner," in a)
    fields = dict(part.split("=", 1) for part in planner.split("=[", 1)[1].rstrip("]").split(","))
    salt = base64.b64decode(fields["salt"].strip('"'))
    salted = hashlib.pbkdf2_hmac("sha512", secrets.password("planner").encode(), salt, int(fields["iterations"]))
    assert base64.b64decode(fields["saltedpassword"].strip('"')) == salted


def _rights(principal: str, topics: Topics) -> set[tuple[str, str]]:
    return {(b.operation.name, b.name) for b in acl_bindings(topics)
            if b.principal == principal and b.resource is Resource.TOPIC and b.pattern is Pattern.LITERAL}


def test_least_privilege_for_the_client_and_the_tool_service():
    topics = Topics("p.")
    client = _rights("client", topics)
    assert ("WRITE", topics.tasks) in client and ("READ", topics.outcomes) in client
    assert ("READ", topics.tokens) in client
    assert not any(name in (topics.tool_requests, topics.tool_results, topics.inference_requests)
                   for _op, name in client)
    # Issue 37, finding 2: schemas decide how records are read; only the services publish them.
    assert ("WRITE", topics.schemas) not in client and ("READ", topics.schemas) in client
    tools = _rights("tools", topics)
    assert {name for op, name in tools if op == "WRITE"} == {
        topics.tool_results, topics.retrieval_requests, topics.dlq, topics.tools, topics.schemas}
    assert {name for op, name in tools if op == "READ"} == {
        topics.tool_requests, topics.retrieval_results, topics.tools, topics.schemas}


def test_groups_and_the_worker_that_runs_every_service():
    topics = Topics()
    bindings = acl_bindings(topics)
    for service in SERVICES:
        group = topics.group(service)
        assert [b.principal for b in bindings if b.resource is Resource.GROUP and b.name == group
                and b.operation is Operation.READ] == sorted([service, "worker"])
        assert _rights(service, topics) <= _rights("worker", topics)
    assert not any(b.principal == "client" and b.resource is Resource.GROUP and b.operation is Operation.READ
                   for b in bindings)
    assert all(b.principal != "admin" for b in bindings)  # the super user needs none


def test_the_security_page_shows_the_acls_the_code_derives():
    from agentstream.ops.acls import acl_markdown

    page = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert acl_markdown(acl_bindings(Topics())) in page


def test_on_the_secure_stack_a_client_reads_with_its_own_database_login(monkeypatch, tmp_path):
    secrets = StackSecrets.ensure(tmp_path / "secrets")
    paths = StackPaths.from_env()
    paths.state_dir.mkdir(parents=True)
    owner = f"postgresql://postgres:{secrets.db_password('postgres')}@127.0.0.1:35432/agentstream"
    write_state(paths.state_file, {"secrets_dir": str(secrets.directory), "database_url": owner,
                                   "approvals": "recorded"})
    settings = Settings.load()
    assert settings.database_url == (f"postgresql://client:{secrets.db_password('client')}"
                                     "@127.0.0.1:35432/agentstream")
    assert settings.approvals == "recorded"
    assert secrets.db_password("client") not in repr(settings)
    assert Settings.load(identity=Identity(database_login="approver")).database_url.startswith("postgresql://approver:")
    # a service: its own login, with only its tables
    assert Settings.load(identity=Identity(principal="planner")).database_url.startswith("postgresql://planner:")
    # a replay runs a pipeline of its own: the schema owner's login
    assert Settings.load(identity=Identity(principal="replay")).database_url == owner
    monkeypatch.setenv("AGENTSTREAM_APPROVALS", "sometimes")
    with pytest.raises(ConfigError, match="AGENTSTREAM_APPROVALS"):
        Settings.load()


def test_each_tenant_gets_a_principal_a_client_login_and_an_approver_login(tmp_path):
    from agentstream.ops.acls import tenant_principal

    secrets = StackSecrets.ensure(tmp_path / "s", ("a",))
    assert tenant_principal("a") in secrets.kafka_principals
    assert secrets.database_logins["tenant-a"] == ("agentstream_tenant",)
    assert secrets.database_logins["approver-a"] == ("agentstream_tenant_approver",)
    assert secrets.password("tenant-a") and secrets.db_password("tenant-a") and secrets.db_password("approver-a")
    topics = Topics("a.")
    rights = {(b.principal, b.operation.name, b.name) for b in acl_bindings(topics, client="tenant-a")}
    assert ("tenant-a", "WRITE", "a.agent.tasks") in rights and ("tenant-a", "READ", "a.agent.outcomes") in rights
    assert not any(who == "client" for who, _op, _name in rights)


def test_a_tenants_process_is_the_tenants_principal_and_logins(monkeypatch, tmp_path):
    assert (Identity().kafka_user(""), Identity().login("")) == ("client", "client")
    assert (Identity().kafka_user("a"), Identity().login("a")) == ("tenant-a", "tenant-a")
    assert Identity(principal="planner").kafka_user("a") == "planner"  # a cell's services are not the tenant's
    assert Identity(database_login="approver").login("a") == "approver-a"
    assert Identity(principal="admin").login("a") is None  # the schema owner's
    secrets = StackSecrets.ensure(tmp_path / "secrets", ("a",))
    paths = StackPaths.from_env()
    paths.state_dir.mkdir(parents=True)
    owner = f"postgresql://postgres:{secrets.db_password('postgres')}@127.0.0.1:35432/agentstream"
    write_state(paths.state_file, {"kafka_security": "SASL_PLAINTEXT", "secrets_dir": str(secrets.directory),
                                   "database_url": owner})
    monkeypatch.setenv("AGENTSTREAM_TENANT", "a")
    monkeypatch.delenv("AGENTSTREAM_TOPIC_PREFIX", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    settings = Settings.load()
    assert (settings.topic_prefix, settings.kafka_auth.username) == ("a.", "tenant-a")
    assert settings.database_url.startswith("postgresql://tenant-a:")
    approver = Settings.load(identity=Identity(database_login="approver"))
    assert approver.database_url.startswith("postgresql://approver-a:") and approver.kafka_auth.username == "tenant-a"
    monkeypatch.setenv("AGENTSTREAM_KAFKA_USERNAME", "someone")  # the environment still wins
    monkeypatch.setenv("AGENTSTREAM_KAFKA_PASSWORD", "pw")
    assert Settings.load(identity=Identity(principal="planner")).kafka_auth.username == "someone"


def test_quotas_come_from_the_environment(monkeypatch):
    from agentstream.streams.config.quotas import Quotas

    assert Quotas.load() == Quotas()
    monkeypatch.setenv("AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT", "5")
    monkeypatch.setenv("AGENTSTREAM_QUOTA_TOKENS_PER_RUN", "1000")
    assert Quotas.load() == Quotas(runs_in_flight=5, tokens_per_run=1000)
    monkeypatch.setenv("AGENTSTREAM_QUOTA_MAX_STEPS", "-3")
    with pytest.raises(ConfigError, match="AGENTSTREAM_QUOTA_MAX_STEPS"):
        Quotas.load()
