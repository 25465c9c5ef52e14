"""The reads the web console needs, which are plain API too (``GET /v1/runs``, ``GET /v1/runs/{id}/timeline``,
``GET /v1/whoami``), and the console itself: static files under ``/console/`` (``services/gateway/console/``,
shipped in the wheel; no Node toolchain, no CDN).

The console is a page like any other client: it holds a bearer token (in the tab's ``sessionStorage``)
and calls the same routes with it, so it can do exactly what its token's role may. Its files are public;
everything they show comes through the API. They are served with a Content-Security-Policy that allows
scripts from the gateway only (and the timeline's one inline script, by its hash), so text a run carries
(a task, a tool's result) can never run as code in the page that holds the token.
"""

from __future__ import annotations

from datetime import datetime
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Query
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import BaseModel, Field
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from agentstream.services.gateway.auth import Reader
from agentstream.services.gateway.problems import COMMON_RESPONSES, Problem
from agentstream.services.gateway.state import GatewayDep
from agentstream.streams.core.kinds import RunStatus
from agentstream.streams.replay import html, timeline

router = APIRouter(prefix="/v1", responses=COMMON_RESPONSES)

#: How much of a task a listed run shows (the run itself, ``GET /v1/runs/{id}``, has all of it).
TASK_PREVIEW_CHARS = 200
#: The console's policy: nothing from elsewhere, scripts only from here (and the timeline's own inline
#: script, allowed by its hash, in the sandboxed frame that shows it), no framing of the console.
CONSOLE_CSP = ("default-src 'self'; script-src 'self' " + html.script_source() + "; "
               "style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-src 'self'; "
               "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


class RunSummary(BaseModel):
    """A run as the list shows it."""

    run_id: str
    status: str
    task: str = Field(description=f"The task's first {TASK_PREVIEW_CHARS} characters.")
    agent: str | None = Field(None, description="The registered agent (`name@version`) it runs; none for the "
                                                "default agent.")
    session: str | None = None
    step_count: int
    error_code: str | None = None
    submitted_at: datetime
    updated_at: datetime
    finished_at: datetime | None = None


class Runs(BaseModel):
    runs: list[RunSummary]


class WhoAmI(BaseModel):
    """The caller's token: its tenant, role, id and name (never its secret)."""

    tenant: str
    role: Literal["reader", "approver", "submitter", "operator"]
    token_id: str
    name: str


@router.get("/runs", response_model=Runs, tags=["runs"], summary="The tenant's runs, latest first")
async def list_runs(principal: Reader, gateway: GatewayDep,
                    status: Annotated[RunStatus | None, Query(description="Only runs in this status.")] = None,
                    agent: Annotated[str | None, Query(max_length=200, description=(
                        "Only runs of this agent: `name@version`, or `name` for any of its versions; one of "
                        "the gateway's own names (default `agentstream`) for the default agent's."))] = None,
                    session: Annotated[str | None, Query(max_length=200,
                                                         description="Only the turns of this session.")] = None,
                    limit: Annotated[int, Query(ge=1, le=500)] = 50) -> Runs:
    cell = gateway.cells.get(principal.tenant)
    default_agent = agent is not None and agent in gateway.config.agents
    rows = await (await gateway.cells.pool()).fetch(
        """SELECT run_id, status, left(task, $6) AS task, state ->> 'agent' AS agent, state ->> 'session' AS session,
                  step_count, error_code, submitted_at, updated_at, finished_at
           FROM runs
           WHERE coalesce(state ->> 'topic_prefix', '') = $1
             AND ($2::text IS NULL OR status = $2)
             AND ($3::text IS NULL OR state ->> 'agent' = $3 OR split_part(state ->> 'agent', '@', 1) = $3)
             AND (NOT $4 OR state ->> 'agent' IS NULL)
             AND ($5::text IS NULL OR state ->> 'session' = $5)
           ORDER BY submitted_at DESC LIMIT $7""",
        cell.prefix, status, None if default_agent else agent, default_agent, session, TASK_PREVIEW_CHARS, limit)
    return Runs(runs=[RunSummary(**dict(row)) for row in rows])


@router.get("/runs/{run_id}/timeline", tags=["runs"], response_class=HTMLResponse,
            summary="A run's timeline, as `agentstream replay show --html` draws it",
            responses={200: {"content": {"text/html": {"schema": {"type": "string"}}},
                             "description": "One self-contained HTML page (inline CSS, SVG and one small "
                                            "script; nothing to fetch)."}})
async def run_timeline(run_id: str, principal: Reader, gateway: GatewayDep,
                       kafka: Annotated[bool, Query(description="Also cross-check each recorded event in Kafka "
                                                                "(slower: connects to the broker).")] = False,
                       ) -> HTMLResponse:
    """The run's steps on a lane per service (queue, compute, transport back), its speed-of-light budget,
    its steps and its events, from PostgreSQL; while the run goes on, as far as it has got."""
    cell = gateway.cells.get(principal.tenant)
    await gateway.cells.owned(cell, run_id)
    if kafka:
        tl = await timeline.show(cell.settings, run_id, check=True)
    else:
        async with (await gateway.cells.pool()).acquire() as conn:
            tl = await timeline.load(conn, run_id)
    if tl is None:
        raise Problem(404, f"no run {run_id!r}", slug="run-not-found")
    return HTMLResponse(html.render(tl), headers={"Cache-Control": "no-store"})


@router.get("/whoami", response_model=WhoAmI, tags=["tokens"], summary="The caller's token: tenant and role")
async def whoami(principal: Reader) -> WhoAmI:
    return WhoAmI(tenant=principal.tenant, role=principal.role.value, token_id=principal.token_id,
                  name=principal.name)


class ConsoleFiles(StaticFiles):
    """The console's files, each with the console's security headers; not cached for long (a new gateway
    version brings new files under the same names)."""

    def file_response(self, full_path: Any, stat_result: Any, scope: Scope, status_code: int = 200) -> Response:
        response = super().file_response(full_path, stat_result, scope, status_code)
        response.headers.update({"Content-Security-Policy": CONSOLE_CSP, "X-Content-Type-Options": "nosniff",
                                 "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"})
        return response


def console_dir() -> Path:
    """Where the console's files are (in the source tree or the installed wheel: package data)."""
    return Path(str(files("agentstream.services.gateway") / "console"))


def mount(app: FastAPI) -> None:
    """Serve the console at ``/console/`` (``/`` and ``/console`` lead there)."""

    @app.get("/", include_in_schema=False)
    @app.get("/console", include_in_schema=False)
    async def to_console() -> RedirectResponse:
        return RedirectResponse("/console/", status_code=307)

    app.mount("/console", ConsoleFiles(directory=console_dir(), html=True), name="console")


__all__ = ["CONSOLE_CSP", "ConsoleFiles", "RunSummary", "Runs", "WhoAmI", "console_dir", "mount", "router"]
