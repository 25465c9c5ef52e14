"""The gateway's dead letters (``/v1/dead-letters``, services/gateway/routes_dlq.py) without a broker: only an
operator token may (403 for every other role), an operator neither approves nor submits, each tenant reads
its own cell's dead-letter topic and re-drives only into its own cell's topics, and what a re-drive did
becomes 200, 404, 409 or 502 problem details. The reading itself is the backbone's (agentstream.streams.dlq,
which `agentstream dlq` shares), stood in for here; tests/integration/test_console.py runs it for real."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agentstream.services.gateway import routes_dlq
from agentstream.services.gateway.app import create_app
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.services.gateway.tokens import Principal, Role
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DeadLetterError
from agentstream.streams.dlq import DeadLetters, LetterDetails, RedriveResult, StoredLetter, redrivable_topics
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.dead_letters import Rejected, dead_letter

SETTINGS = Settings(kafka_bootstrap="127.0.0.1:1", database_url="postgresql://nobody@127.0.0.1:1/none")
TOKENS = {
    "ags_reader": Principal(tenant="acme", role=Role.READER, token_id="r1"),
    "ags_approver": Principal(tenant="acme", role=Role.APPROVER, token_id="a1"),
    "ags_submitter": Principal(tenant="acme", role=Role.SUBMITTER, token_id="s1"),
    "ags_operator": Principal(tenant="acme", role=Role.OPERATOR, token_id="o1", name="oncall"),
}
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


async def _verify(token: str) -> Principal | None:
    return TOKENS.get(token)


def client() -> TestClient:
    app = create_app(SETTINGS, dataclasses.replace(GatewaySettings()), verifier=_verify)
    return TestClient(app, raise_server_exceptions=False)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def problem(response: Any, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["type"].endswith("/" + slug), body
    return body


def letter(source_topic: str = "acme.agent.tasks") -> StoredLetter:
    rejected = Rejected(run_id="run-1", step="dlq:x:0:7", service="planner", consumer="planner",
                        source_topic=source_topic, source_partition=0, source_offset=7, key=b"k",
                        value=b"\x00not an event", headers={}, error_kind="undecodable", reason="not wire format")
    built = dead_letter(rejected, Codec(LocalRegistry()), 512 * 1024, created_at=WHEN)
    return StoredLetter("acme.agent.dlq", 0, 3, WHEN, built, redrives=0)


class FakeLetters:
    """Stands in for ``DeadLetters``: records how the route built it and what it asked."""

    made: list[dict[str, Any]] = []
    redrive_result: RedriveResult = RedriveResult(3, "redriven", "13 bytes from the letter → acme.agent.tasks[0]@9",
                                                  "acme.agent.tasks[0]@7", target_offset=9, value_from="letter")
    fail_with: Exception | None = None

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        FakeLetters.made.append({"prefix": settings.topic_prefix, **kwargs})

    async def __aenter__(self) -> FakeLetters:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def list(self, **filters: Any) -> list[StoredLetter]:
        FakeLetters.made[-1]["filters"] = filters
        if self.fail_with is not None:
            raise self.fail_with
        return [letter()]

    async def show(self, offset: int) -> LetterDetails:
        if offset != 3:
            raise DeadLetterError(f"letter {offset}: there is no record acme.agent.dlq[0]@{offset}")
        return LetterDetails(letter(), None, "the original does not decode: not wire format", [])

    async def redrive(self, offsets: list[int], **options: Any) -> list[RedriveResult]:
        FakeLetters.made[-1]["redrive"] = (offsets, options)
        return [dataclasses.replace(self.redrive_result, offset=offsets[0])]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> type[FakeLetters]:
    FakeLetters.made = []
    FakeLetters.fail_with = None
    monkeypatch.setattr(routes_dlq, "DeadLetters", FakeLetters)
    return FakeLetters


def test_only_an_operator_token_reaches_dead_letters(fake: type[FakeLetters]) -> None:
    with client() as c:
        for token in ("ags_reader", "ags_approver", "ags_submitter"):
            body = problem(c.get("/v1/dead-letters", headers=auth(token)), 403, "forbidden")
            assert "needs a operator token" in body["detail"] or "operator" in body["detail"]
            problem(c.get("/v1/dead-letters/3", headers=auth(token)), 403, "forbidden")
            problem(c.post("/v1/dead-letters/3/redrive", headers=auth(token)), 403, "forbidden")
        problem(c.get("/v1/dead-letters"), 401, "unauthorized")
    assert fake.made == []  # nothing was read for them


def test_an_operator_reads_but_neither_submits_nor_approves(fake: type[FakeLetters]) -> None:
    with client() as c:
        who = c.get("/v1/whoami", headers=auth("ags_operator"))
        assert who.status_code == 200 and who.json()["role"] == "operator"
        assert c.get("/v1/models", headers=auth("ags_operator")).status_code == 200
        problem(c.post("/v1/runs", json={"task": "x"}, headers=auth("ags_operator")), 403, "forbidden")
        problem(c.post("/v1/approvals/run-1/run-1:1:tool/approve", headers=auth("ags_operator")), 403, "forbidden")
        problem(c.post("/v1/runs/run-1/cancel", headers=auth("ags_operator")), 403, "forbidden")


def test_an_operator_lists_and_shows_its_own_cells_letters(fake: type[FakeLetters]) -> None:
    with client() as c:
        listed = c.get("/v1/dead-letters?kind=undecodable&source_topic=acme.agent.tasks&limit=5",
                       headers=auth("ags_operator"))
        assert listed.status_code == 200, listed.text
        (row,) = listed.json()["letters"]
        assert row["offset"] == 3 and row["error_kind"] == "undecodable" and row["source_topic"] == "acme.agent.tasks"
        made = fake.made[-1]
        assert made["prefix"] == "acme."  # the tenant's cell: acme.agent.dlq, nobody else's
        assert made["targets"] == redrivable_topics(Topics(prefix="acme."))
        assert made["filters"] == {"kind": "undecodable", "source_topic": "acme.agent.tasks", "limit": 5}
        shown = c.get("/v1/dead-letters/3", headers=auth("ags_operator"))
        assert shown.status_code == 200, shown.text
        assert shown.json()["value_preview"].startswith("base64:") and shown.json()["original"] is None
        problem(c.get("/v1/dead-letters/4", headers=auth("ags_operator")), 404, "dead-letter-not-found")
        problem(c.get("/v1/dead-letters/-1", headers=auth("ags_operator")), 422, "invalid-request")
        problem(c.get("/v1/dead-letters?kind=whatever", headers=auth("ags_operator")), 422, "invalid-request")
        fake.fail_with = DeadLetterError("dead-letter topic: there is no topic acme.agent.dlq")
        empty = c.get("/v1/dead-letters", headers=auth("ags_operator"))
        assert empty.status_code == 200 and empty.json() == {"letters": []}


@pytest.mark.parametrize(("result", "status", "slug"), [
    (RedriveResult(3, "refused", "letter 3: there is no record acme.agent.dlq[0]@3 (acme.agent.dlq[0] ends at 1)"),
     404, "dead-letter-not-found"),
    (RedriveResult(3, "refused", "agent.tasks is not a topic this letter may be re-driven to here"), 409,
     "redrive-refused"),
    (RedriveResult(3, "failed", "KafkaTimeoutError: timed out"), 502, "redrive-failed"),
    (RedriveResult(3, "failed", "TopicAuthorizationFailedError: [Error 29]"), 403, "forbidden"),
])
def test_a_redrive_that_did_not_happen_is_a_problem(fake: type[FakeLetters], result: RedriveResult, status: int,
                                                    slug: str) -> None:
    original = fake.redrive_result
    fake.redrive_result = result
    try:
        with client() as c:
            problem(c.post("/v1/dead-letters/3/redrive", headers=auth("ags_operator")), status, slug)
    finally:
        fake.redrive_result = original


def test_an_operators_redrive_is_recorded_as_the_token(fake: type[FakeLetters]) -> None:
    with client() as c:
        done = c.post("/v1/dead-letters/3/redrive", json={"force": True}, headers=auth("ags_operator"))
        assert done.status_code == 200, done.text
        assert done.json()["action"] == "redriven" and done.json()["target_offset"] == 9
    made = fake.made[-1]
    assert made["redriven_by"] == "gateway:acme:oncall"
    assert made["redrive"] == ([3], {"dry_run": False, "force": True})


def test_the_redrivable_topics_are_the_cells_own() -> None:
    topics = Topics(prefix="acme.")
    targets = redrivable_topics(topics)
    assert topics.tasks in targets and topics.tool_requests in targets
    assert topics.dlq not in targets and topics.runs not in targets and topics.schemas not in targets
    assert all(t.startswith("acme.agent.") for t in targets)
    assert not targets & redrivable_topics(Topics(prefix=""))


async def test_the_backbone_refuses_a_letter_that_would_leave_the_cell() -> None:
    codec = Codec(LocalRegistry())
    letters = DeadLetters(SETTINGS, codec=codec, redriven_by="t", targets=redrivable_topics(Topics(prefix="acme.")))
    result = await letters._redrive_one(letter(source_topic="beta.agent.tasks"), dry_run=False, force=False)
    assert result.action == "refused" and "beta.agent.tasks is not a topic" in result.detail
    await letters.close()


def test_the_operator_role_is_in_the_tokens_table() -> None:
    root = Path(__file__).resolve().parents[2]
    sql = (root / "infra" / "postgres" / "migrations" / "0020_gateway_operators.sql").read_text()
    assert "'operator'" in sql and "DROP CONSTRAINT IF EXISTS gateway_tokens_role_check" in sql
    assert Role("operator") is Role.OPERATOR
    assert Principal("acme", Role.OPERATOR, "o1").may(Role.READER)
    assert not Principal("acme", Role.OPERATOR, "o1").may(Role.APPROVER)
    assert not Principal("acme", Role.SUBMITTER, "s1").may(Role.OPERATOR)
