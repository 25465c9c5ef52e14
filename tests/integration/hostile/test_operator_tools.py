"""The operator's tools with least privilege (issue 36, item 2; docs/security.md, "The operator's tools"), on
the secure stack with two tenants:

- `agentstream dlq` and `agentstream replay` resolve, from the stack's own state file as on `dev up
  --secure`, to logins and principals of their own (the operator's reader to read, the operator to
  re-drive, the replay login to re-run; a tenant's own when ``AGENTSTREAM_TENANT`` is set), and the
  database says none of them is the schema owner or a superuser;
- a tenant lists and shows its own dead letters and reads its own runs' timelines, and sees nothing of the
  other tenant's (another cell's dead-letter topic is not even listed to it, another cell's run is "no run");
- re-driving is the operator's: a tenant's and the operator's reader's re-drives are refused before
  anything is published or recorded, the operator's goes through, and its record is visible to the tenant
  whose letter it was and to no other;
- a recorded rerun as the replay login completes, and that login cannot write, or decide on, a run that
  is not a replay's.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import asyncpg
import pytest
from aiokafka import TopicPartition

from agentstream.cli import dlq as dlq_cli
from agentstream.cli import replay as replay_cli
from agentstream.ops.acls import tenant_prefix, tenant_principal
from agentstream.ops.dlq import DeadLetters
from agentstream.replay.rerun import rerun
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import ConfigError, DeadLetterError
from agentstream.streams.replay import timeline
from agentstream.testing import end_offsets
from tests.integration.acl_probes import can_read, connection, send
from tests.integration.hostile.conftest import ACME, BETA, Cells
from tests.integration.hostile.test_decisions import _cli

pytestmark = pytest.mark.asyncio(loop_scope="package")
CALCULATION = '[[tool:calculator {"expression": "6 * 7"}]] [[answer:42]]'


async def _completed_run(cells: Cells, tenant: str) -> str:
    async with cells.client(tenant) as client:
        run_id = await client.submit(CALCULATION, tools=["calculator"], prefetch=False)
        result = await client.wait(run_id, timeout=60)
    assert result.status == "completed", result
    return run_id


async def _junk_letter(cells: Cells, tenant: str, key: str) -> int:
    """A record the tenant's planner cannot decode, on the tenant's intake; its letter's offset in the cell's
    dead-letter topic."""
    topics = cells.topics(tenant)
    source = await send(cells.stack, tenant_principal(tenant), topics.tasks, b"\x00junk from " + tenant.encode(),
                        key, 0)
    await cells.dead_letter(tenant, topics.tasks, source)
    async with DeadLetters(_as(cells, tenant, "operator-reader")) as letters:
        found = [s.offset for s in await letters.list(source_topic=topics.tasks)
                 if s.letter is not None and (s.letter.source_partition, s.letter.source_offset) == source]
    assert len(found) == 1, found
    return found[0]


def _as(cells: Cells, tenant: str, who: str) -> Settings:
    """Settings for ``tenant``'s cell as ``who`` (Kafka principal and database login of that name)."""
    return cells.stack.settings(topic_prefix=tenant_prefix(tenant), principal=who, database_login=who)


def _load(monkeypatch, cells: Cells, tenant: str | None, identity) -> Settings:
    """What a CLI process resolves on this machine: the stack's state file, no connection variables."""
    for name in ("DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS", "AGENTSTREAM_TOPIC_PREFIX", "AGENTSTREAM_KAFKA_USERNAME",
                 "AGENTSTREAM_KAFKA_PASSWORD_FILE", "AGENTSTREAM_KAFKA_PASSWORD",
                 "AGENTSTREAM_KAFKA_SECURITY_PROTOCOL", "AGENTSTREAM_TENANT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTSTREAM_STATE_DIR", str(cells.stack.paths.state_dir))
    if tenant:
        monkeypatch.setenv("AGENTSTREAM_TENANT", tenant)
    return Settings.load(identity=identity())


async def test_the_tools_never_connect_as_the_schema_owner(cells, monkeypatch):
    expected = {  # (tenant, command) → the Kafka principal and the database login it is
        (None, "dlq list"): ("operator-reader", lambda: dlq_cli.identity(redrive=False)),
        (None, "dlq redrive"): ("operator", lambda: dlq_cli.identity(redrive=True)),
        (None, "replay show"): ("operator-reader", lambda: replay_cli.identity(rerun=False)),
        (None, "replay rerun"): ("replay", lambda: replay_cli.identity(rerun=True)),
        (ACME, "dlq list"): ("tenant-acme", lambda: dlq_cli.identity(redrive=False)),
        (ACME, "replay show"): ("tenant-acme", lambda: replay_cli.identity(rerun=False)),
    }
    for (tenant, command), (name, identity) in expected.items():
        settings = _load(monkeypatch, cells, tenant, identity)
        assert settings.kafka_auth.username == name, command
        assert urlsplit(settings.database_url).username == name, command
        async with connection(settings.database_url) as conn:
            who = await conn.fetchrow("SELECT session_user AS login, r.rolsuper, "
                                      "(SELECT rolname FROM pg_roles o JOIN pg_class c ON c.relowner = o.oid "
                                      " WHERE c.relname = 'runs') AS owner "
                                      "FROM pg_roles r WHERE r.rolname = session_user")
        assert who["login"] == name and not who["rolsuper"] and who["owner"] != name, (command, dict(who))
    for redrive_or_rerun in (lambda: dlq_cli.identity(redrive=True), lambda: replay_cli.identity(rerun=True)):
        with pytest.raises(ConfigError, match="operator's"):
            _load(monkeypatch, cells, ACME, redrive_or_rerun)


async def test_a_tenant_inspects_its_own_dead_letters_and_runs_only(cells):
    acme_letter = await _junk_letter(cells, ACME, "inspect-acme")
    beta_letter = await _junk_letter(cells, BETA, "inspect-beta")
    acme_run = await _completed_run(cells, ACME)

    # Dead letters: acme's own, through its own principal and login; nothing of beta's cell.
    async with DeadLetters(_as(cells, ACME, tenant_principal(ACME))) as letters:
        mine = await letters.list()
        assert acme_letter in [s.offset for s in mine]
        assert all(s.letter is None or s.letter.source_topic.startswith(tenant_prefix(ACME)) for s in mine)
        shown = await letters.show(acme_letter)
        assert shown.stored.letter is not None and shown.stored.letter.source_topic == cells.topics(ACME).tasks
    assert not await can_read(cells.stack, tenant_principal(ACME), cells.topics(BETA).dlq)
    own_login_elsewhere = cells.stack.settings(topic_prefix=tenant_prefix(BETA), principal=tenant_principal(ACME),
                                               database_login=tenant_principal(ACME))
    async with DeadLetters(own_login_elsewhere, read_timeout_s=5) as letters:
        with pytest.raises(DeadLetterError, match="no topic"):
            await letters.show(beta_letter)

    # Runs: acme's timeline with its own rights: the services' topics (and its intake, which it writes) are
    # not acme's to read, so their events are left unchecked, said so, never reported missing; the
    # operator's reader reads every topic and verifies them all. Beta's login finds no such run.
    tl = await timeline.show(_as(cells, ACME, tenant_principal(ACME)), acme_run)
    assert tl is not None and tl.run["answer"] == "42"
    recorded = [e for e in tl.events if e.offset is not None]
    assert recorded and all(e.kafka == "unchecked" and "may not read" in e.kafka_note for e in recorded), tl.events
    operators = await timeline.show(cells.stack.settings(principal="operator-reader", database_login="operator-reader"),
                                    acme_run)
    assert operators is not None and {e.kafka for e in operators.events if e.offset is not None} == {"verified"}
    assert await timeline.show(_as(cells, BETA, tenant_principal(BETA)), acme_run) is None

    # And through the real CLI, as acme's operator runs it on this machine.
    listed = await _cli(cells, ACME, "dlq", "list", "--json", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    sources = {row.get("source_topic") for row in json.loads(listed.stdout)}
    assert cells.topics(ACME).tasks in sources and cells.topics(BETA).tasks not in sources
    shown_cli = await _cli(cells, BETA, "replay", "show", acme_run, "--json")
    assert shown_cli.returncode == 2 and f"no run {acme_run}" in shown_cli.stderr, shown_cli.stdout + shown_cli.stderr
    diff_cli = await _cli(cells, ACME, "replay", "diff", acme_run, acme_run, "--json")
    assert diff_cli.returncode == 0, diff_cli.stderr


async def test_redriving_is_the_operators_only(cells):
    letter = await _junk_letter(cells, ACME, "redrive-acme")
    tasks = [TopicPartition(cells.topics(ACME).tasks, 0)]
    before = await end_offsets(cells.stack.settings(), tasks)

    for who in (tenant_principal(ACME), "operator-reader"):
        async with DeadLetters(_as(cells, ACME, who)) as letters:
            (refused,) = await letters.redrive([letter])
        assert refused.action == "refused" and "operator's" in refused.detail, (who, refused)
    refused_cli = await _cli(cells, ACME, "dlq", "redrive", str(letter))
    assert refused_cli.returncode == 2 and "operator's" in refused_cli.stderr, refused_cli.stdout + refused_cli.stderr
    assert await end_offsets(cells.stack.settings(), tasks) == before  # nothing was published
    async with connection(cells.stack.database_url) as conn:
        assert await conn.fetchval("SELECT count(*) FROM dlq_redrives WHERE dlq_topic = $1 AND dlq_offset = $2",
                                   cells.topics(ACME).dlq, letter) == 0

    async with DeadLetters(_as(cells, ACME, "operator")) as letters:
        (done,) = await letters.redrive([letter])
    assert done.action == "redriven", done
    assert (await end_offsets(cells.stack.settings(), tasks))[tasks[0]] == before[tasks[0]] + 1

    # The record of it: the tenant whose letter it was reads it, the other tenant does not.
    async with DeadLetters(_as(cells, ACME, tenant_principal(ACME))) as letters:
        assert [r["target_offset"] for r in (await letters.show(letter)).redrives] == [done.target_offset]
    count = "SELECT count(*) FROM dlq_redrives WHERE dlq_topic = $1 AND dlq_offset = $2"
    for login, visible in ((tenant_principal(ACME), 1), (tenant_principal(BETA), 0), ("operator-reader", 1),
                           ("gateway", 1)):  # (the gateway re-drives for its operator tokens: it sees them all)
        async with connection(cells.stack.database_url_for(login)) as conn:
            assert await conn.fetchval(count, cells.topics(ACME).dlq, letter) == visible, login


async def test_a_rerun_writes_replays_and_nothing_else(cells):
    original = await _completed_run(cells, ACME)
    replay = cells.stack.settings(principal="replay", database_login="replay")
    result = await rerun(replay, original, mode="recorded", timeout=60)
    assert result.finished and result.same_decisions, result.as_dict()
    async with connection(cells.stack.database_url) as conn:
        assert await conn.fetchval("SELECT replay_of FROM runs WHERE run_id = $1", result.run_id) == original

    async with connection(cells.stack.database_url_for("replay")) as conn:
        assert await conn.execute("UPDATE runs SET answer = 'forged' WHERE run_id = $1", original) == "UPDATE 0"
        assert await conn.execute("UPDATE steps SET error = 'forged' WHERE run_id = $1", original) == "UPDATE 0"
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("""INSERT INTO runs (run_id, status, task, state, version, step_count)
                                  VALUES ('run-forged-by-replay', 'running', 'x', '{"topic_prefix": "acme."}', 1, 0)""")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DELETE FROM runs WHERE run_id = $1", result.run_id)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO dlq_redrives (dlq_topic, dlq_partition, dlq_offset, letter_event_id, "
                               "source_topic, source_partition, source_offset, value_from) "
                               "VALUES ('agent.dlq', 0, 0, 'x', 'agent.tasks', 0, 0, 'letter')")
        # A decision on a run that is not a replay's: no row, nothing recorded (an approver would get ZA001).
        assert await conn.fetch("SELECT * FROM agentstream_decide($1, $2, true, 'replay')", original,
                                f"{original}:1") == []
    async with connection(cells.stack.database_url) as conn:
        assert await conn.fetchval("SELECT answer FROM runs WHERE run_id = $1", original) == "42"
