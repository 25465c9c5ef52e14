"""Every error the gateway answers is an RFC 9457 problem-details document (``application/problem+json``).

One shape for every failure, whoever raised it: a route (``Problem``), FastAPI's request validation
(422, or 400 for a body that is not JSON at all), Starlette's own 404/405, agentstream's errors
(``TaskRejected`` is 422, ``Unavailable`` 503), and anything unexpected (500, logged, without its
details). A client reads ``status`` and ``type`` (a stable URI per kind of problem) and shows ``detail``.
On the OpenAI-compatible paths the same body also carries an ``error`` member in OpenAI's own shape,
which the OpenAI SDKs read for their exception's message (RFC 9457 allows extension members).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentstream.streams.core.errors import (
    NotAnApprover,
    NotAwaitingApproval,
    TaskRejected,
    TopicsMissing,
    Unavailable,
)
from agentstream.streams.core.outages import DATABASE, KAFKA, outage_of

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
#: The base of every problem ``type`` URI (documented in docs/gateway.md, "Errors").
TYPE_BASE = "https://agentstream.dev/problems/"
#: Paths whose clients are OpenAI SDKs: their problems carry OpenAI's ``error`` member too.
OPENAI_PATHS = ("/v1/chat/completions", "/v1/models")

_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
           409: "Conflict", 413: "Content Too Large", 415: "Unsupported Media Type", 422: "Unprocessable Content",
           429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}
_SLUGS = {400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found", 405: "method-not-allowed",
          409: "conflict", 413: "body-too-large", 415: "unsupported-media-type", 422: "invalid-request",
          429: "rate-limited", 500: "internal", 502: "run-failed", 503: "unavailable", 504: "timeout"}


class InvalidParam(BaseModel):
    """One field a request got wrong: where (``name``, dotted: ``body.max_steps``) and why."""

    name: str
    reason: str


class ProblemDetails(BaseModel):
    """RFC 9457 problem details: ``type`` identifies the kind of problem, ``title`` names it, ``status`` is
    the HTTP status, ``detail`` explains this occurrence; ``invalid_params`` lists the fields at fault."""

    type: str = Field(examples=[TYPE_BASE + "invalid-request"])
    title: str
    status: int
    detail: str = ""
    instance: str | None = None
    invalid_params: list[InvalidParam] | None = None


class Problem(Exception):
    """An error a route answers with: ``status``, a ``detail`` a person can read, an optional ``slug``
    (the end of the ``type`` URI; default: the status's), and headers (``Retry-After``, ``WWW-Authenticate``)."""

    def __init__(self, status: int, detail: str, *, slug: str | None = None, title: str | None = None,
                 headers: Mapping[str, str] | None = None, code: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.slug = slug or _SLUGS.get(status, "error")
        self.title = title or _TITLES.get(status, "Error")
        self.headers = dict(headers or {})
        self.code = code  # OpenAI's ``error.code``: e.g. a failed run's error_code


def problem_response(request: Request | None, problem: Problem,
                     invalid: Sequence[InvalidParam] | None = None) -> JSONResponse:
    body = ProblemDetails(type=TYPE_BASE + problem.slug, title=problem.title, status=problem.status,
                          detail=problem.detail, instance=request.url.path if request is not None else None,
                          invalid_params=list(invalid) if invalid else None).model_dump(exclude_none=True)
    if request is not None and request.url.path.startswith(OPENAI_PATHS):
        body["error"] = {"message": problem.detail, "type": problem.slug.replace("-", "_"),
                         "param": invalid[0].name if invalid else None, "code": problem.code or problem.slug}
    return JSONResponse(body, status_code=problem.status, headers=problem.headers, media_type=MEDIA_TYPE)


def _where(loc: Sequence[Any]) -> str:
    return ".".join(str(part) for part in loc)


def validation_problem(errors: Sequence[Mapping[str, Any]]) -> tuple[Problem, list[InvalidParam]]:
    """FastAPI's validation errors as one problem: 400 when the body is not JSON at all, else 422 with
    each field at fault."""
    if any(e.get("type") == "json_invalid" for e in errors):
        where = next((e for e in errors if e.get("type") == "json_invalid"), {})
        reason = (where.get("ctx") or {}).get("error", "malformed JSON")
        return Problem(400, f"the request body is not valid JSON: {reason}", slug="malformed-json"), []
    invalid = [InvalidParam(name=_where(e.get("loc", ())), reason=str(e.get("msg", "invalid"))) for e in errors]
    summary = "; ".join(f"{p.name}: {p.reason}" for p in invalid[:5])
    return Problem(422, f"the request is not valid: {summary}"), invalid


def install(app: FastAPI) -> None:
    """Route every error through ``problem_response``."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return problem_response(request, exc)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        kind = request.headers.get("content-type", "")
        if request.method in ("POST", "PUT", "PATCH") and "json" not in kind and \
                any(tuple(e.get("loc", ())) == ("body",) for e in exc.errors()):
            # FastAPI reads a body as JSON only when it says so (`curl -d` sends a form): say that, not
            # "Input should be a valid dictionary".
            return problem_response(request, Problem(
                415, f"the request body must be JSON, sent with Content-Type: application/json (not {kind or 'none'})",
                slug="unsupported-media-type"))
        problem, invalid = validation_problem(exc.errors())
        return problem_response(request, problem, invalid)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else _TITLES.get(exc.status_code, "error")
        return problem_response(request, Problem(exc.status_code, detail, headers=exc.headers))

    async def on_rejected(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(request, Problem(422, str(exc), slug="task-rejected"))

    async def on_unavailable(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(request, Problem(503, str(exc), headers={"Retry-After": "5"}))

    async def on_not_awaiting(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(request, Problem(409, str(exc), slug="not-awaiting-approval"))

    async def on_not_approver(request: Request, exc: Exception) -> JSONResponse:
        return problem_response(request, Problem(403, str(exc), slug="forbidden"))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        outage = outage_of(exc)
        if outage in (DATABASE, KAFKA):  # the broker or PostgreSQL away: come back, as any worker waits it out
            what = "PostgreSQL" if outage == DATABASE else "Kafka"
            log.warning("gateway: %s %s: %s is unavailable (%s)", request.method, request.url.path, what,
                        type(exc).__name__)
            return problem_response(request, Problem(503, f"{what} is unavailable ({type(exc).__name__}); try "
                                                          "again later", headers={"Retry-After": "5"}))
        log.exception("gateway: %s %s failed", request.method, request.url.path, exc_info=exc)
        return problem_response(request, Problem(500, "the gateway failed to serve this request; it was logged"))

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(TaskRejected, on_rejected)
    app.add_exception_handler(Unavailable, on_unavailable)
    app.add_exception_handler(TopicsMissing, on_unavailable)
    app.add_exception_handler(NotAwaitingApproval, on_not_awaiting)
    app.add_exception_handler(NotAnApprover, on_not_approver)
    app.add_exception_handler(Exception, on_unexpected)


#: The responses every route documents besides its own (OpenAPI).
COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"description": _TITLES[status],
             "content": {MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/ProblemDetails"}}}}
    for status in (401, 403, 404, 413, 422, 429, 503)
}

__all__ = ["COMMON_RESPONSES", "MEDIA_TYPE", "InvalidParam", "Problem", "ProblemDetails", "install",
           "problem_response", "validation_problem"]
