"""The gateway's ASGI application: ``create_app`` puts the routes, the limits and the error shapes together.

FastAPI (on Starlette, served by uvicorn) rather than aiohttp, which the workers use for /metrics: the
gateway is an API other people program against, and FastAPI derives its OpenAPI document from the same
pydantic models that validate each request, so the document cannot drift from the code (a unit test
compares the committed docs/openapi.json with the app's). Why in more words: docs/gateway.md.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentstream.services.gateway import problems, routes_console, routes_dlq, routes_openai, routes_runs
from agentstream.services.gateway.auth import Verify
from agentstream.services.gateway.limits import BodyLimit, Slots
from agentstream.services.gateway.problems import Problem, problem_response
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.services.gateway.state import Gateway
from agentstream.streams.config.settings import Settings

log = logging.getLogger(__name__)

#: FastAPI's own OpenTelemetry instrumentation (on by default, against the global providers: no-ops here)
#: is off: it cost ~0.1 ms of CPU per request for spans nobody exports, and the runs a request starts are
#: traced by the pipeline itself (the client's traceparent on every event: docs/architecture.md).
TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False, "operation_spans": False}

VERSION = "1.0.0"
DESCRIPTION = """Runs agentstream agents over HTTP: submit a task, follow its steps and tokens as Server-Sent
Events (resumable with `Last-Event-ID`), approve tool calls, manage conversations, or talk to an agent through
the OpenAI Chat Completions API. Every error is an RFC 9457 problem-details document. See docs/gateway.md."""


class InFlight:
    """ASGI middleware: at most ``Slots.limit`` requests being worked on at once; beyond, 503 with
    Retry-After. A request holds its slot until its response starts: a stream, once it streams, holds a
    stream slot instead (routes take those), so a thousand open streams do not starve short requests.
    ``requests`` counts each request as it arrives, admitted or not (what the autoscaler follows)."""

    def __init__(self, app: ASGIApp, slots: Slots, requests: Counter | None = None) -> None:
        self.app = app
        self.slots = slots
        self.requests = requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in ("/healthz", "/readyz", "/metrics"):
            await self.app(scope, receive, send)
            return
        if self.requests is not None:
            self.requests.inc()
        try:
            self.slots.acquire()
        except Problem as busy:
            await problem_response(None, busy)(scope, receive, send)
            return
        held = True

        async def started(message: Message) -> None:
            nonlocal held
            if held and message["type"] == "http.response.start":
                held = False
                self.slots.release()
            await send(message)

        try:
            await self.app(scope, receive, started)
        finally:
            if held:
                self.slots.release()


def create_app(settings: Settings, config: GatewaySettings | None = None, *, verifier: Verify | None = None,
               gateway: Gateway | None = None) -> FastAPI:
    """The gateway for the pipeline ``settings`` names. ``verifier`` replaces the token check (unit tests);
    ``gateway`` an already built state (tests that share one)."""
    config = config or GatewaySettings.load()
    state = gateway or Gateway.build(settings, config, verifier=verifier)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if gateway is None:  # a state given by the caller is the caller's to close
                await state.close()

    app = FastAPI(title="agentstream gateway", version=VERSION, description=DESCRIPTION, lifespan=lifespan,
                  docs_url="/docs", redoc_url=None, openapi_url="/openapi.json", telemetry=TELEMETRY)
    app.state.gateway = state
    problems.install(app)
    app.include_router(routes_runs.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_console.router)
    app.include_router(routes_dlq.router)
    routes_console.mount(app)  # the web console, /console/

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        return JSONResponse({"ok": True})

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        """Prometheus metrics (services/gateway/metrics.py); like /healthz, no token needed."""
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        """Ready once PostgreSQL answers (tokens are checked there)."""
        try:
            await (await state.cells.pool()).fetchval("SELECT 1")
        except Exception as exc:
            return JSONResponse({"ready": False, "reason": f"PostgreSQL: {type(exc).__name__}"}, status_code=503)
        return JSONResponse({"ready": True, "streams": state.streams.used, "requests": state.in_flight.used})

    app.add_middleware(InFlight, slots=state.in_flight, requests=state.metrics.requests)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The document FastAPI derives, plus the SSE payloads (not return types, so not derived) and the
    problem-details schema every error uses."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi
    from pydantic.json_schema import models_json_schema

    from agentstream.services.gateway.openai_models import ChatCompletionChunk
    from agentstream.services.gateway.problems import ProblemDetails
    from agentstream.services.gateway.sse import OutcomeData, StepData, TokenData

    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    _, extra = models_json_schema([(m, "serialization") for m in (TokenData, StepData, OutcomeData,
                                                                   ChatCompletionChunk, ProblemDetails)],
                                  ref_template="#/components/schemas/{model}")
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in sorted(extra.get("$defs", {}).items()):
        schemas.setdefault(name, schema)
    app.openapi_schema = doc
    return doc


__all__ = ["VERSION", "InFlight", "create_app"]
