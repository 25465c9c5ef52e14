"""The gateway's HTTP behaviour that needs no broker or database: who may call what (401/403), every error
as RFC 9457 problem details (422 validation, 400 malformed JSON, 413, 404/405 of the router), the rate
limit per tenant (429 + Retry-After), the in-flight bound (503 + Retry-After), and the OpenAI door's own
refusals. Tokens are checked by a stand-in verifier; routes that would reach Kafka are not called."""

from __future__ import annotations

import dataclasses

import pytest
from fastapi.testclient import TestClient

from agentstream.services.gateway.app import create_app
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.services.gateway.tokens import Principal, Role
from agentstream.streams.config.settings import Settings

SETTINGS = Settings(kafka_bootstrap="127.0.0.1:1", database_url="postgresql://nobody@127.0.0.1:1/none")
TOKENS = {
    "ags_reader": Principal(tenant="acme", role=Role.READER, token_id="r1"),
    "ags_approver": Principal(tenant="acme", role=Role.APPROVER, token_id="a1"),
    "ags_submitter": Principal(tenant="acme", role=Role.SUBMITTER, token_id="s1"),
    "ags_other": Principal(tenant="beta", role=Role.SUBMITTER, token_id="s2"),
}


async def _verify(token: str) -> Principal | None:
    return TOKENS.get(token)


def client(**config: object) -> TestClient:
    app = create_app(SETTINGS, dataclasses.replace(GatewaySettings(), **config), verifier=_verify)  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=False)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_problem(response, status: int, slug: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["title"] and isinstance(body["detail"], str)
    assert body["type"].startswith("https://agentstream.dev/problems/")
    if slug:
        assert body["type"].endswith("/" + slug), body["type"]
    return body


def test_a_missing_or_unknown_token_is_401_with_a_challenge() -> None:
    with client() as c:
        missing = c.get("/v1/approvals")
        body = assert_problem(missing, 401, "unauthorized")
        assert missing.headers["WWW-Authenticate"].startswith("Bearer")
        assert "bearer token is required" in body["detail"]
        wrong = c.get("/v1/approvals", headers=auth("ags_nope"))
        assert_problem(wrong, 401)
        assert 'error="invalid_token"' in wrong.headers["WWW-Authenticate"]
        assert_problem(c.get("/v1/approvals", headers={"Authorization": "Basic dXNlcjpwYXNz"}), 401)


def test_roles_reader_reads_only_approver_decides_submitter_submits() -> None:
    with client() as c:
        body = assert_problem(c.post("/v1/runs", json={"task": "x"}, headers=auth("ags_reader")), 403, "forbidden")
        assert "reader token may not" in body["detail"]
        assert_problem(c.post("/v1/runs", json={"task": "x"}, headers=auth("ags_approver")), 403)
        assert_problem(c.post("/v1/approvals/run-1/run-1:1:tool/approve", headers=auth("ags_reader")), 403)
        # a submitter may not approve: who asks for a refund should not approve it
        assert_problem(c.post("/v1/approvals/run-1/run-1:1:tool/deny", headers=auth("ags_submitter")), 403)
        assert_problem(c.post("/v1/runs/run-1/cancel", headers=auth("ags_reader")), 403)
        assert_problem(c.delete("/v1/sessions/s-1", headers=auth("ags_approver")), 403)
        models = c.get("/v1/models", headers=auth("ags_reader"))  # reads need no broker
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "agentstream"


def test_validation_errors_are_422_problems_naming_each_field() -> None:
    with client() as c:
        response = c.post("/v1/runs", json={"task": "", "max_steps": 0, "on_tool_error": "shrug"},
                          headers=auth("ags_submitter"))
        body = assert_problem(response, 422, "invalid-request")
        names = {p["name"] for p in body["invalid_params"]}
        assert {"body.task", "body.max_steps", "body.on_tool_error"} <= names
        # the approver is the token's: a body that names one is refused, not obeyed
        decided = c.post("/v1/approvals/run-1/run-1:1:tool/approve", json={"reason": "ok", "decided_by": "mallory"},
                         headers=auth("ags_approver"))
        assert "body.decided_by" in {p["name"] for p in assert_problem(decided, 422)["invalid_params"]}


def test_malformed_json_is_400_and_a_wrong_type_is_422() -> None:
    with client() as c:
        bad = c.post("/v1/runs", content=b'{"task": "x",', headers={**auth("ags_submitter"),
                                                                    "Content-Type": "application/json"})
        assert "not valid JSON" in assert_problem(bad, 400, "malformed-json")["detail"]
        assert_problem(c.post("/v1/runs", json=["task"], headers=auth("ags_submitter")), 422)


def test_a_body_over_the_limit_is_413_whether_declared_or_not() -> None:
    with client(max_body_bytes=1000) as c:
        declared = c.post("/v1/runs", json={"task": "x" * 5000}, headers=auth("ags_submitter"))
        assert_problem(declared, 413, "body-too-large")

        def chunks():  # no Content-Length: counted as it arrives
            yield b'{"task": "'
            for _ in range(20):
                yield b"y" * 100
            yield b'"}'

        streamed = c.post("/v1/runs", content=chunks(), headers={**auth("ags_submitter"),
                                                                 "Content-Type": "application/json"})
        assert_problem(streamed, 413)


def test_a_tenant_over_its_rate_gets_429_with_retry_after_and_others_do_not() -> None:
    with client(rate_per_s=0.5, burst=2) as c:
        for _ in range(2):
            assert c.get("/v1/models", headers=auth("ags_submitter")).status_code == 200
        limited = c.get("/v1/models", headers=auth("ags_submitter"))
        assert_problem(limited, 429, "rate-limited")
        assert int(limited.headers["Retry-After"]) >= 1
        assert c.get("/v1/models", headers=auth("ags_other")).status_code == 200  # another tenant's bucket


def test_a_replica_at_its_bound_of_requests_answers_503_with_retry_after() -> None:
    with client(max_in_flight=1) as c:
        gateway = c.app.state.gateway  # type: ignore[attr-defined]
        gateway.in_flight.used = 1  # one request already being served
        busy = c.get("/v1/models", headers=auth("ags_reader"))
        assert_problem(busy, 503, "busy")
        assert busy.headers["Retry-After"] == "1"
        gateway.in_flight.used = 0
        assert c.get("/v1/models", headers=auth("ags_reader")).status_code == 200
        assert gateway.in_flight.used == 0  # released when the response started


def test_a_broker_out_of_reach_is_503_with_retry_after() -> None:
    with client() as c:  # SETTINGS name a broker nobody listens at
        away = c.post("/v1/runs", json={"task": "x"}, headers=auth("ags_submitter"))
        assert "Kafka is unavailable" in assert_problem(away, 503, "unavailable")["detail"]
        assert away.headers["Retry-After"] == "5"


def test_the_routers_own_errors_are_problems_too() -> None:
    with client() as c:
        assert_problem(c.get("/v1/nothing-here"), 404)
        assert_problem(c.put("/v1/runs", headers=auth("ags_submitter")), 405)
        assert c.get("/healthz").json() == {"ok": True}


def test_the_openai_door_speaks_problem_details_with_openais_error_member() -> None:
    with client() as c:
        several = c.post("/v1/chat/completions", json={"model": "agentstream", "n": 2,
                                                       "messages": [{"role": "user", "content": "hi"}]},
                         headers=auth("ags_submitter"))
        body = assert_problem(several, 422)
        assert "n > 1" in body["detail"] and body["error"]["message"] == body["detail"]
        tools = c.post("/v1/chat/completions", json={"model": "agentstream", "messages": [{"role": "user", "content": "hi"}],
                                                     "tools": [{"type": "function", "function": {"name": "f"}}]},
                       headers=auth("ags_submitter"))
        assert "client-side tools" in assert_problem(tools, 422)["detail"]
        last = c.post("/v1/chat/completions", json={"model": "agentstream",
                                                    "messages": [{"role": "user", "content": "hi"},
                                                                 {"role": "assistant", "content": "hello"}]},
                      headers=auth("ags_submitter"))
        assert "last message must be the user's" in assert_problem(last, 422)["detail"]
        image = c.post("/v1/chat/completions", json={"model": "agentstream", "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
            headers=auth("ags_submitter"))
        assert_problem(image, 422, "unsupported-content")


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "a\nb"])
def test_a_bad_idempotency_key_is_400(key: str) -> None:
    from agentstream.services.gateway.problems import Problem
    from agentstream.services.gateway.state import idempotency_key

    with pytest.raises(Problem) as raised:
        idempotency_key(key)
    assert raised.value.status == 400


def test_a_body_that_is_not_sent_as_json_is_415_saying_so() -> None:
    with client() as c:
        form = c.post("/v1/runs", content=b'{"task": "x"}', headers={**auth("ags_submitter"),
                                                                    "Content-Type": "application/x-www-form-urlencoded"})
        assert "Content-Type: application/json" in assert_problem(form, 415, "unsupported-media-type")["detail"]


def test_metrics_are_served_without_a_token_and_name_no_tenant() -> None:
    with client() as c:
        c.get("/v1/models", headers=auth("ags_reader"))
        page = c.get("/metrics")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/plain")
        for name in ("agentstream_gateway_token_delivery_seconds_bucket", "agentstream_gateway_streams_open 0.0",
                     "agentstream_gateway_streams_dropped_total", "agentstream_gateway_hub_lag_seconds_count"):
            assert name in page.text
        assert "acme" not in page.text
