"""Who the operator's tools are (issue 36, item 2; docs/security.md, "The operator's tools"): on the local
secure stack `agentstream dlq` and `agentstream replay` pick a principal and a login of their own for what
they do, never the schema owner's; a tenant's process reads as the tenant and may not re-drive or re-run.
The rights behind those names are derived here from the same tables the stack applies (its integration
tests, tests/integration/hostile/test_operator_tools.py, try them on a real broker and database)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from agentstream.cli import dlq as dlq_cli
from agentstream.cli import replay as replay_cli
from agentstream.devstack.secure import DATABASE_LOGINS, StackSecrets
from agentstream.ops.acls import Operation, acl_bindings, tenant_prefix, tenant_principal
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import StackPaths, write_state
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.kafka.topics import Topics

CASES = {  # (tenant, what) → the principal and login it resolves to
    (None, "dlq read"): (lambda: dlq_cli.identity(redrive=False), "operator-reader"),
    (None, "dlq redrive"): (lambda: dlq_cli.identity(redrive=True), "operator"),
    (None, "replay read"): (lambda: replay_cli.identity(rerun=False), "operator-reader"),
    (None, "replay rerun"): (lambda: replay_cli.identity(rerun=True), "replay"),
    ("acme", "dlq read"): (lambda: dlq_cli.identity(redrive=False), "tenant-acme"),
    ("acme", "replay read"): (lambda: replay_cli.identity(rerun=False), "tenant-acme"),
}


@pytest.fixture
def secure_stack(monkeypatch, tmp_path) -> None:
    """A state file of a secure stack with tenant acme, and no connection variables."""
    for name in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "AGENTSTREAM_TENANT", "AGENTSTREAM_TOPIC_PREFIX",
                 "AGENTSTREAM_KAFKA_USERNAME", "AGENTSTREAM_KAFKA_PASSWORD_FILE", "AGENTSTREAM_KAFKA_PASSWORD",
                 "AGENTSTREAM_KAFKA_SECURITY_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTSTREAM_STATE_DIR", str(tmp_path / "state"))
    secrets = StackSecrets.ensure(tmp_path / "secrets", ("acme",))
    paths = StackPaths.from_env()
    paths.state_dir.mkdir(parents=True)
    owner = f"postgresql://postgres:{secrets.db_password('postgres')}@127.0.0.1:35432/agentstream"
    write_state(paths.state_file, {"secrets_dir": str(secrets.directory), "database_url": owner,
                                   "kafka_security": "SASL_PLAINTEXT", "kafka": "127.0.0.1:39092"})


@pytest.mark.parametrize(("tenant", "what"), list(CASES))
def test_each_command_is_a_principal_and_login_of_its_own(secure_stack, monkeypatch, tenant, what):
    if tenant:
        monkeypatch.setenv("AGENTSTREAM_TENANT", tenant)
    identity, name = CASES[(tenant, what)]
    settings = Settings.load(identity=identity())
    assert settings.kafka_auth.username == name
    assert urlsplit(settings.database_url).username == name != "postgres"
    assert settings.topic_prefix == (tenant_prefix(tenant) if tenant else "")


def test_a_tenant_may_not_redrive_or_rerun(secure_stack, monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_TENANT", "acme")
    with pytest.raises(ConfigError, match="operator's"):
        dlq_cli.identity(redrive=True)
    with pytest.raises(ConfigError, match="operator's"):
        replay_cli.identity(rerun=True)
    runner = CliRunner()
    for app, args in ((dlq_cli.app, ["redrive", "3"]), (replay_cli.app, ["rerun", "run-1"]),
                      (replay_cli.app, ["fork", "run-1", "--from-step", "1"])):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "operator's" in result.output, (args, result.output)


def test_the_logins_roles_and_the_principals_rights():
    assert DATABASE_LOGINS["operator"] == ("agentstream_operator",)
    assert DATABASE_LOGINS["replay"] == ("agentstream_replay",)
    default, acme = acl_bindings(Topics()), acl_bindings(Topics(tenant_prefix("acme")), client=tenant_principal("acme"))
    for bindings in (default, acme):  # the operator's reader writes nothing, anywhere
        assert not [b for b in bindings if b.principal == "operator-reader" and b.operation is not Operation.READ
                    and b.resource.name == "TOPIC"]
    reads = {b.name for b in acme if b.principal == tenant_principal("acme") and b.operation is Operation.READ}
    assert Topics(tenant_prefix("acme")).dlq in reads  # a tenant inspects its own dead letters
    assert not any(b.name.startswith("agent.") for b in acme if b.principal == tenant_principal("acme"))
    assert Topics().dlq not in {b.name for b in default if b.principal == "client"}  # the default client: not the operator's

