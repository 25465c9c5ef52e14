"""``/v1/runs``, ``/v1/approvals`` and ``/v1/sessions``: the pipeline's client calls over HTTP.

Each route is a thin layer over ``AgentClient`` (streams/client/agent_client.py) in the caller's cell:
the same validation, the same events, the same reads. What the gateway adds is who may (services/gateway/
auth.py), whose run it is (a run of another tenant is 404), an idempotent submit, and a run's events as
Server-Sent Events that resume from ``Last-Event-ID`` (services/gateway/stream.py).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse

from agentstream.services.gateway.auth import Approver, Reader, Submitter
from agentstream.services.gateway.hub import Hub
from agentstream.services.gateway.metrics import GatewayMetrics
from agentstream.services.gateway.models import (
    Approval,
    Approvals,
    Cancelled,
    CancelRequest,
    DecisionRequest,
    DecisionView,
    Links,
    RunAccepted,
    RunRequest,
    RunView,
    SessionDeleted,
    Sessions,
    SessionSummary,
    SessionView,
    StepView,
    TurnView,
)
from agentstream.services.gateway.positions import BadPosition, Position
from agentstream.services.gateway.problems import COMMON_RESPONSES, Problem
from agentstream.services.gateway.sse import MEDIA_TYPE as SSE
from agentstream.services.gateway.sse import EventStreamResponse, comment, frame, rendered
from agentstream.services.gateway.state import GatewayDep, idempotency_key, run_id_for_key
from agentstream.services.gateway.stream import Idle, RunStream, SlowReader
from agentstream.streams.client.outcomes import parse_output
from agentstream.streams.store.sessions import SessionRow

router = APIRouter(prefix="/v1", responses=COMMON_RESPONSES)


@router.post("/runs", status_code=202, response_model=RunAccepted, tags=["runs"],
             summary="Submit a task", response_description="The task was accepted; its run id")
async def submit(body: RunRequest, principal: Submitter, gateway: GatewayDep, response: Response,
                 key: Annotated[str | None, Header(alias="Idempotency-Key",
                                                   description="The same key (per tenant) gives the same run.")] = None,
                 ) -> RunAccepted:
    """Validate and publish a task in the caller's cell. With an ``Idempotency-Key``, a retry (after a
    timeout, a lost connection, on any replica) names the same run, which starts once."""
    agent = None if body.agent in gateway.config.agents else body.agent  # the gateway's names: the default agent
    cell = gateway.cells.get(principal.tenant)
    client = await gateway.cells.connected(cell)
    key = idempotency_key(key)
    run_id = run_id_for_key(client.topics, principal.tenant, key, body.session) if key else None
    deadline: datetime | timedelta | None = None
    if isinstance(body.deadline, datetime):
        deadline = body.deadline
    elif body.deadline is not None:
        deadline = timedelta(seconds=body.deadline)
    run_id = await client.submit(
        body.task, tools=body.tools, max_steps=body.max_steps, deadline=deadline, model=body.model,
        system_prompt=body.system_prompt, metadata=body.metadata, prefetch=body.prefetch,
        on_tool_error=body.on_tool_error, run_id=run_id, output_schema=body.output_schema,
        max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, stop=body.stop,
        seed=body.seed, session=body.session, tool_calling=body.tool_calling, agent=agent)
    client.forget(run_id)  # nobody here waits on it: the client need not follow its outcome
    gateway.metrics.submitted.inc()
    response.headers["Location"] = f"/v1/runs/{run_id}"
    return RunAccepted(run_id=run_id, session=body.session,
                       links=Links(self=f"/v1/runs/{run_id}", events=f"/v1/runs/{run_id}/events"))


@router.get("/runs/{run_id}", response_model=RunView, tags=["runs"], summary="A run's status, answer and steps")
async def get_run(run_id: str, principal: Reader, gateway: GatewayDep) -> RunView:
    cell = gateway.cells.get(principal.tenant)
    ref = await gateway.cells.owned(cell, run_id)
    details = await cell.client.status(run_id)
    if details is None:
        raise Problem(404, f"no run {run_id!r}", slug="run-not-found")
    return RunView(run_id=run_id, status=details["status"], task=details["task"], answer=details["answer"],
                   output=parse_output(ref.output), error_code=details["error_code"], error=details["error"],
                   step_count=details["step_count"], session=ref.session, submitted_at=details["submitted_at"],
                   updated_at=details["updated_at"], finished_at=details["finished_at"],
                   steps=[StepView(index=s["step_index"], kind=s["kind"], status=s["status"], request=s["request"],
                                   result=s["result"], error=s["error"], requested_at=s["requested_at"],
                                   completed_at=s["completed_at"]) for s in details["steps"]])


@router.get("/runs/{run_id}/events", tags=["runs"], summary="A run's events, as Server-Sent Events",
            response_class=EventStreamResponse, status_code=200,
            responses={200: {"content": {SSE: {"schema": {"type": "string"}}},
                             "description": "`event: token` (TokenData), `event: step` (StepData), and last "
                                            "`event: outcome` (OutcomeData); each `id:` is a position to resume "
                                            "from (docs/gateway.md, \"Streaming\")."},
                       204: {"description": "The run has ended and the stream was read to its end: nothing "
                                            "more will come (an EventSource stops reconnecting)."}})
async def run_events(run_id: str, principal: Reader, gateway: GatewayDep,
                     last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
                     after: Annotated[str | None, Query(description="The same as Last-Event-ID, for clients "
                                                                    "that cannot set headers.")] = None,
                     ) -> Response:
    """The run's tokens and steps as they happen, from its beginning or from where ``Last-Event-ID``
    says, ending with its outcome. A client that was cut off (network, a replica gone, too slow a
    reader) reconnects with the last id it received and misses nothing."""
    cell = gateway.cells.get(principal.tenant)
    ref = await gateway.cells.owned(cell, run_id)
    hub = await gateway.cells.hub(cell)
    start = _position(last_event_id or after, hub.topics.partition_for(run_id))
    if start is not None and ref.terminal and start.at_least(await hub.end_position(start.partition)):
        return Response(status_code=204)
    gateway.streams.acquire()
    try:
        frames = _frames(hub, run_id, start, ref.submitted_at.timestamp(), ref.terminal,
                         gateway.config.keepalive_s, gateway.metrics)
    except BaseException:
        gateway.streams.release()
        raise
    return EventStreamResponse(frames, write_timeout_s=max(10.0, 2 * gateway.config.keepalive_s),
                               on_close=gateway.streams.release)


def _position(text: str | None, partition: int) -> Position | None:
    if not text:
        return None
    try:
        position = Position.decode(text)
    except BadPosition as exc:
        raise Problem(400, str(exc), slug="bad-event-id") from None
    if position.partition != partition:
        raise Problem(400, "the event id is not of this run's stream", slug="bad-event-id")
    return position


async def _frames(hub: Hub, run_id: str, start: Position | None, submitted_wall: float, terminal: bool,
                  keepalive_s: float, metrics: GatewayMetrics) -> AsyncIterator[bytes]:
    yield b"retry: 1000\n\n"
    async with RunStream(hub, run_id, start=start, submitted_wall=submitted_wall, terminal=terminal,
                         keepalive_s=keepalive_s) as stream:
        try:
            async for emitted in stream.events():
                if isinstance(emitted, Idle):
                    yield comment("keepalive")
                    continue
                shown = rendered(emitted.item)
                if shown is not None:
                    yield frame(event=shown[0], data=shown[1], id=emitted.position.encode())
                    # Resumed once the writer asks for the next frame: this one's write has completed.
                    metrics.stream_events.inc()
                    if shown[0] == "token":
                        metrics.token_delivery.observe(max(0.0, time.time() - emitted.item.timestamp_ms / 1000))
        except SlowReader:
            yield comment("this reader fell behind and was dropped; reconnect with Last-Event-ID")


@router.post("/runs/{run_id}/cancel", status_code=202, response_model=Cancelled, tags=["runs"],
             summary="Cancel a run")
async def cancel(run_id: str, principal: Submitter, gateway: GatewayDep, body: CancelRequest | None = None,
                 ) -> Cancelled:
    """Ask the run to stop: it fails with ``cancelled`` and a generation in progress stops. A run that has
    ended is left as it is (``status: ended``)."""
    cell = gateway.cells.get(principal.tenant)
    ref = await gateway.cells.owned(cell, run_id)
    if ref.terminal:
        return Cancelled(run_id=run_id, status="ended")
    client = await gateway.cells.connected(cell)
    await client.cancel(run_id, reason=(body.reason if body else "") or f"cancelled through the gateway by "
                                                                        f"{principal.approver_name}")
    return Cancelled(run_id=run_id, status="cancelling")


@router.get("/approvals", response_model=Approvals, tags=["approvals"], summary="Tool calls waiting for a person")
async def approvals(principal: Reader, gateway: GatewayDep) -> Approvals:
    cell = gateway.cells.get(principal.tenant)
    waiting = await cell.client.awaiting_approval()
    mine = await gateway.cells.owned_ids(cell, sorted({w["run_id"] for w in waiting})) if waiting else set()
    return Approvals(approvals=[Approval(run_id=w["run_id"], step_id=w["step_id"], tool=w.get("tool"),
                                         arguments=w.get("arguments"), since=w["since"])
                                for w in waiting if w["run_id"] in mine])


@router.post("/approvals/{run_id}/{step_id}/approve", response_model=DecisionView, tags=["approvals"],
             summary="Let a waiting tool call run")
async def approve(run_id: str, step_id: str, principal: Approver, gateway: GatewayDep,
                  body: DecisionRequest | None = None) -> DecisionView:
    """The approver is the token (``gateway:<tenant>:<token name or id>``), never the body. Answers the
    decision that holds: the first on a step stands."""
    return await _decide(gateway, principal.tenant, principal.approver_name, run_id, step_id, True, body)


@router.post("/approvals/{run_id}/{step_id}/deny", response_model=DecisionView, tags=["approvals"],
             summary="Refuse a waiting tool call")
async def deny(run_id: str, step_id: str, principal: Approver, gateway: GatewayDep,
               body: DecisionRequest | None = None) -> DecisionView:
    return await _decide(gateway, principal.tenant, principal.approver_name, run_id, step_id, False, body)


async def _decide(gateway: GatewayDep, tenant: str, by: str, run_id: str, step_id: str, approved: bool,
                  body: DecisionRequest | None) -> DecisionView:
    cell = gateway.cells.get(tenant)
    await gateway.cells.owned(cell, run_id)
    client = await gateway.cells.connected(cell)
    if client.settings.approvals == "open":  # (recorded: agentstream_decide refuses such a step itself)
        waiting = await client.awaiting_approval()
        if not any(w["run_id"] == run_id and w["step_id"] == step_id for w in waiting):
            raise Problem(409, f"run {run_id} does not wait for approval at step {step_id}; nothing was sent "
                               "(GET /v1/approvals lists the calls waiting)", slug="not-awaiting-approval")
    reason = body.reason if body else ""
    # recorded as the token's (migration 0021), not as the gateway's login
    decision = await (client.approve if approved else client.deny)(run_id, step_id, reason=reason, by=by,
                                                                    record_by=True)
    return DecisionView(run_id=run_id, step_id=step_id, approved=decision.approved, as_asked=decision.as_asked,
                        reason=decision.reason, decided_by=decision.decided_by, decided_at=decision.decided_at,
                        recorded=decision.recorded, earlier=decision.earlier)


@router.get("/sessions", response_model=Sessions, tags=["sessions"], summary="Conversations, latest first")
async def sessions(principal: Reader, gateway: GatewayDep,
                   limit: Annotated[int, Query(ge=1, le=500)] = 50) -> Sessions:
    cell = gateway.cells.get(principal.tenant)
    return Sessions(sessions=[_summary(row) for row in await cell.client.sessions.list(limit)])


@router.get("/sessions/{session_id}", response_model=SessionView, tags=["sessions"],
            summary="A conversation's transcript and turns still going")
async def session(session_id: str, principal: Reader, gateway: GatewayDep) -> SessionView:
    cell = gateway.cells.get(principal.tenant)
    details = await cell.client.sessions.show(session_id)
    if details is None:
        raise Problem(404, f"no session {session_id!r}", slug="session-not-found")
    row = details.row
    return SessionView(**_summary(row).model_dump(), summary=row.summary, transcript=row.turns,
                       going=[TurnView(run_id=t.run_id, status=t.status, seq=t.seq) for t in details.going])


@router.delete("/sessions/{session_id}", response_model=SessionDeleted, tags=["sessions"],
               summary="Delete a conversation", responses={404: COMMON_RESPONSES[404]})
async def delete_session(session_id: str, principal: Submitter, gateway: GatewayDep) -> SessionDeleted | JSONResponse:
    """Erase the transcript; the session's turns still going are asked to stop (they fail with
    ``session_deleted``). A later turn under the same id starts a new, empty session."""
    cell = gateway.cells.get(principal.tenant)
    client = await gateway.cells.connected(cell)
    stopping = await client.sessions.delete(session_id)
    if stopping is None:
        raise Problem(404, f"no session {session_id!r}", slug="session-not-found")
    return SessionDeleted(session_id=session_id, stopping=stopping)


def _summary(row: SessionRow) -> SessionSummary:
    return SessionSummary(session_id=row.session_id, turns=len(row.turns), dropped=row.dropped, tokens=row.tokens,
                          last_run_id=row.last_run_id, created_at=row.created_at, updated_at=row.updated_at,
                          deleted_at=row.deleted_at)


__all__ = ["router"]
