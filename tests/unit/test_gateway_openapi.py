"""The committed OpenAPI document (docs/openapi.json) is the one the gateway's code gives: regenerate it
with `make openapi` after changing a route or a model, or this fails."""

from __future__ import annotations

import json
from pathlib import Path

from agentstream.services.gateway import openapi

COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_committed_openapi_document_is_up_to_date() -> None:
    assert json.loads(COMMITTED.read_text()) == openapi.document(), \
        "docs/openapi.json is out of date: run `make openapi`"
    assert COMMITTED.read_text() == openapi.text()  # byte for byte, as `make openapi` writes it


def test_the_document_names_every_route_and_the_security_scheme() -> None:
    doc = openapi.document()
    assert doc["openapi"].startswith("3.")
    assert {"/v1/runs", "/v1/runs/{run_id}", "/v1/runs/{run_id}/events", "/v1/runs/{run_id}/cancel", "/v1/approvals",
            "/v1/approvals/{run_id}/{step_id}/approve", "/v1/approvals/{run_id}/{step_id}/deny", "/v1/sessions",
            "/v1/sessions/{session_id}", "/v1/chat/completions", "/v1/models", "/v1/dead-letters",
            "/v1/dead-letters/{offset}", "/v1/dead-letters/{offset}/redrive"} <= set(doc["paths"])
    assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for schema in ("ProblemDetails", "TokenData", "StepData", "OutcomeData", "ChatCompletionChunk"):
        assert schema in doc["components"]["schemas"]
    submit = doc["paths"]["/v1/runs"]["post"]
    assert submit["security"] == [{"bearer": []}]
    assert submit["responses"]["429"]["content"]["application/problem+json"]["schema"]["$ref"].endswith("/ProblemDetails")
