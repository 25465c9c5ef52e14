"""Decisions on tool calls say what holds, not what was asked for (issue 37, finding 8): the client maps
what ``agentstream_decide`` returns (or raises) to a ``Decision``; the CLI prints it and exits 3 when an
earlier, different decision stands. The operator's reader is a login of its own on the local stack."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from agentstream.cli.approvals import EXIT_EARLIER_STANDS, OPERATOR_READER, decision_json, describe
from agentstream.devstack.secure import DATABASE_LOGINS, StackSecrets
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.identity import Identity
from agentstream.streams.config.settings import Settings
from agentstream.streams.config.stack_state import StackPaths, write_state
from agentstream.streams.core.approvals import Decision
from agentstream.streams.core.errors import NotAnApprover, NotAwaitingApproval

AT = datetime(2026, 12, 6, 9, 30, tzinfo=UTC)


def _decision(asked: bool, approved: bool, *, earlier: bool = False, recorded: bool = True) -> Decision:
    return Decision(run_id="r1", step_id="r1:1:tool", asked=asked, approved=approved, reason="", decided_by="ana",
                    decided_at=AT if recorded else None, recorded=recorded, earlier=earlier)


def test_the_cli_says_what_holds_and_exits_3_when_an_earlier_different_decision_stands():
    text, status = describe(_decision(False, False))
    assert (text, status) == ("denied: r1 r1:1:tool (recorded by ana at 2026-12-06T09:30:00+00:00)", 0)

    text, status = describe(_decision(False, False, earlier=True))  # a retry: what was asked holds
    assert status == 0 and text.startswith("already denied: r1 r1:1:tool") and "this one was not recorded" in text

    text, status = describe(_decision(False, True, earlier=True))  # deny after an approval: the tool runs
    assert status == EXIT_EARLIER_STANDS == 3
    assert text.startswith("not denied: r1 r1:1:tool was approved by ana at 2026-12-06T09:30:00+00:00")
    assert "earlier decision stands" in text and "the tool call goes ahead" in text
    assert "denied:" not in text.replace("not denied:", "")

    text, status = describe(_decision(True, False, earlier=True))
    assert status == 3 and text.startswith("not approved:") and "does not run" in text

    text, status = describe(_decision(False, False, recorded=False))  # open: nothing to read back
    assert status == 0 and text.startswith("deny announced: r1 r1:1:tool")
    assert "AGENTSTREAM_APPROVALS=open" in text and "agentstream status r1" in text


def test_the_json_form_carries_what_holds_and_whether_it_was_asked():
    data = decision_json(_decision(False, True, earlier=True))
    assert data == {"run_id": "r1", "step_id": "r1:1:tool", "asked": False, "approved": True, "reason": "",
                    "decided_by": "ana", "decided_at": "2026-12-06T09:30:00+00:00", "recorded": True,
                    "earlier": True, "as_asked": False}


class _Pool:
    """What ``AgentClient._record`` calls of a pool: one ``fetchrow`` answering ``agentstream_decide``."""

    def __init__(self, answer: dict[str, Any] | BaseException | None) -> None:
        self.answer = answer

    async def fetchrow(self, query: str, *args: object) -> dict[str, Any] | None:
        assert "agentstream_decide" in query
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


async def _decide(answer: dict[str, Any] | BaseException | None, *, approvals: str = "recorded",
                  approve: bool = False) -> tuple[Decision, list[Any]]:
    settings = Settings(kafka_bootstrap="127.0.0.1:9", database_url="postgresql://approver-acme@127.0.0.1:9/db",
                        approvals=approvals)  # type: ignore[arg-type]
    client = AgentClient(settings)
    sent: list[Any] = []

    async def pool() -> _Pool:
        return _Pool(answer)

    async def send(topic: str, event: Any) -> asyncio.Future[None]:
        sent.append(event)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    client.pool = pool  # type: ignore[method-assign]
    client.runtime.send = send  # type: ignore[method-assign]
    try:
        decision = await (client.approve if approve else client.deny)("r1", "r1:1:tool", "no", "boss")
    finally:
        await client.runtime.producer.stop()  # made, never started: closed, not leaked
    return decision, sent


async def test_the_client_returns_the_recorded_decision_and_announces_it():
    row = {"approved": True, "reason": "", "decided_by": "approver-acme", "decided_at": AT, "decided_now": False}
    decision, sent = await _decide(row)
    assert decision == Decision(run_id="r1", step_id="r1:1:tool", asked=False, approved=True, reason="",
                                decided_by="approver-acme", decided_at=AT, recorded=True, earlier=True)
    assert not decision.as_asked
    assert [(e.approved, e.decided_by) for e in sent] == [(True, "approver-acme")]  # the record, not the ask

    decision, _ = await _decide({**row, "approved": False, "reason": "no", "decided_now": True})
    assert (decision.approved, decision.earlier, decision.as_asked) == (False, False, True)


async def test_a_step_the_run_does_not_wait_at_and_a_login_that_is_no_approver_are_refused():
    refused = asyncpg.PostgresError.new({"C": "ZA001", "S": "ERROR", "M": "run r1 is running: it does not wait "
                                         "for approval at step r1:1:tool"})
    with pytest.raises(NotAwaitingApproval, match=r"run r1 is running.*nothing was recorded"):
        await _decide(refused)
    with pytest.raises(NotAnApprover, match="approver-acme"):
        await _decide(None)
    with pytest.raises(asyncpg.PostgresError):  # any other database error is not disguised
        await _decide(asyncpg.PostgresError.new({"C": "XX000", "S": "ERROR", "M": "internal"}))


async def test_open_approvals_announce_the_decision_asked_for_and_record_nothing():
    decision, sent = await _decide(AssertionError("no database in open mode"), approvals="open", approve=True)
    assert (decision.approved, decision.recorded, decision.decided_at, decision.decided_by) == (True, False, None,
                                                                                                 "boss")
    assert [(e.approved, e.reason) for e in sent] == [(True, "no")]


def test_the_operator_reader_is_a_login_of_its_own_and_no_client_has_its_role(monkeypatch, tmp_path):
    assert DATABASE_LOGINS[OPERATOR_READER] == ("agentstream_operator_reader",)
    assert DATABASE_LOGINS["client"] == ("agentstream_reader",)
    assert not any("agentstream_operator_reader" in roles for login, roles in DATABASE_LOGINS.items()
                   if login != OPERATOR_READER)
    for name in ("DATABASE_URL", "AGENTSTREAM_TENANT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AGENTSTREAM_STATE_DIR", str(tmp_path / "state"))
    secrets = StackSecrets.ensure(tmp_path / "secrets", ("acme",))
    assert secrets.db_password(OPERATOR_READER)
    paths = StackPaths.from_env()
    paths.state_dir.mkdir(parents=True)
    owner = f"postgresql://postgres:{secrets.db_password('postgres')}@127.0.0.1:35432/agentstream"
    write_state(paths.state_file, {"secrets_dir": str(secrets.directory), "database_url": owner})
    assert Settings.load().database_url.startswith("postgresql://client:")
    reader = Identity(database_login=OPERATOR_READER)  # `agentstream status --operator`
    assert Settings.load(identity=reader).database_url.startswith("postgresql://operator-reader:")


class _GatewayPool:
    """A pool where ``agentstream_decide_as`` (migration 0021) answers ``as_answer`` and ``agentstream_decide``
    ``row``; records the queries."""

    def __init__(self, as_answer: dict[str, Any] | BaseException | None, row: dict[str, Any]) -> None:
        self.as_answer, self.row, self.queries = as_answer, row, []  # type: ignore[var-annotated]

    async def fetchrow(self, query: str, *args: object) -> dict[str, Any] | None:
        self.queries.append((query.split("FROM ")[1].split("(")[0], args))
        if "agentstream_decide_as" in query:
            if isinstance(self.as_answer, BaseException):
                raise self.as_answer
            return self.as_answer
        return self.row


@pytest.mark.parametrize("as_answer", ["recorded", None, asyncpg.InsufficientPrivilegeError("denied"),
                                       asyncpg.UndefinedFunctionError("no such function")])
async def test_the_gateway_records_its_tokens_decision_as_the_token_else_under_its_login(as_answer):
    by = "gateway:acme:ops-desk"
    token_row = {"approved": True, "reason": "ok", "decided_by": by, "decided_at": AT, "decided_now": True}
    login_row = {**token_row, "decided_by": "gateway"}
    pool = _GatewayPool(token_row if as_answer == "recorded" else as_answer, login_row)
    settings = Settings(kafka_bootstrap="127.0.0.1:9", database_url="postgresql://gateway@127.0.0.1:9/db",
                        approvals="recorded")
    client = AgentClient(settings)

    async def the_pool() -> _GatewayPool:
        return pool

    async def send(topic: str, event: Any) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    client.pool = the_pool  # type: ignore[method-assign]
    client.runtime.send = send  # type: ignore[method-assign]
    try:
        decision = await client.approve("r1", "r1:1:tool", "ok", by, record_by=True)
    finally:
        await client.runtime.producer.stop()
    assert pool.queries[0] == ("agentstream_decide_as", ("r1", "r1:1:tool", True, "ok", by))
    if as_answer == "recorded":
        assert decision.decided_by == by and len(pool.queries) == 1
    else:  # not the gateway's login (or no migration 0021): recorded under the login, as before
        assert decision.decided_by == "gateway" and pool.queries[1][0] == "agentstream_decide"
