"""``/v1/dead-letters``: an operator token's view of its cell's dead letters, and re-drive (issue 33, item 3).

The same code as ``agentstream dlq list|show|redrive`` (the backbone's ``agentstream.streams.dlq``), in the
caller's cell: the dead-letter topic under the tenant's prefix (``<tenant>.agent.dlq``; the default
tenant's is the gateway's own), so a tenant never sees another cell's letters, and a re-drive goes only to
a redrivable topic of that same cell (a letter naming any other source topic is refused). A letter is
named by its offset in that topic, as the command line names it. Every route needs an ``operator`` token
(403 for any other role): a letter holds a record whole, and a re-drive republishes it.

The re-drive is recorded (``dlq_redrives``) as by ``gateway:<tenant>:<token name or id>``, so a letter is
re-driven once unless forced, whichever front re-drives it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from aiokafka.errors import GroupAuthorizationFailedError, TopicAuthorizationFailedError
from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, Field

from agentstream.services.gateway.auth import Operator
from agentstream.services.gateway.problems import COMMON_RESPONSES, Problem
from agentstream.services.gateway.state import Gateway, GatewayDep
from agentstream.streams.core.errors import DeadLetterError
from agentstream.streams.core.kinds import DeadLetterKind
from agentstream.streams.dlq import DeadLetters, RedriveResult, redrivable_topics
from agentstream.streams.kafka.topics import Topics

router = APIRouter(prefix="/v1", responses=COMMON_RESPONSES)

LetterId = Annotated[int, Path(ge=0, description="The letter's offset in the cell's dead-letter topic.")]


class DeadLetterSummary(BaseModel):
    """A letter as the list shows it (``agentstream dlq list --json``). A record of the dead-letter topic
    that is not a letter has only ``offset``, ``partition``, ``time`` and ``problem``."""

    offset: int = Field(description="The letter's id: its offset in the cell's dead-letter topic.")
    partition: int
    time: datetime
    redrives: int | None = Field(None, description="How often it was re-driven (null: PostgreSQL could not say).")
    problem: str | None = None
    source_topic: str | None = None
    source_partition: int | None = None
    source_offset: int | None = None
    consumer: str | None = Field(None, description="The service that gave up on the record.")
    error_kind: str | None = None
    reason: str | None = None
    run_id: str | None = None
    truncated: bool | None = Field(None, description="The letter keeps only the start of the record (a re-drive "
                                                     "reads the original from its source topic).")
    value_size: int | None = None
    redrive_of: str | None = Field(None, description="The letter this record is a re-driven copy of.")


class DeadLetterList(BaseModel):
    letters: list[DeadLetterSummary]


class DeadLetterView(DeadLetterSummary):
    """Everything a letter holds (``agentstream dlq show --json``), and the original event when it decodes."""

    event_id: str | None = None
    step_id: str | None = None
    parent_step_id: str | None = None
    created_at: datetime | None = None
    producer: str | None = None
    instance: str | None = None
    key: str | None = None
    headers: dict[str, str | None] | None = None
    value_preview: str | None = None
    value_base64: str | None = None
    value_kept: int | None = None
    value_sha256: str | None = None
    original_type: str | None = None
    original: dict[str, Any] | None = None
    original_problem: str | None = None
    redrive_history: list[dict[str, Any]] = Field(default_factory=list)


class RedriveRequest(BaseModel):
    force: bool = Field(default=False, description="Re-drive a letter that was re-driven before, again.")
    dry_run: bool = Field(default=False, description="Say what would be re-driven; publish nothing.")


class RedriveView(BaseModel):
    """What a re-drive did: ``redriven``, ``would_redrive`` (dry run) or ``skipped`` (re-driven before).
    A letter that cannot be re-driven is a 409 problem, a publish that failed a 502."""

    offset: int
    action: Literal["redriven", "would_redrive", "skipped"]
    detail: str
    source: str | None = None
    target_offset: int | None = None
    value_from: Literal["letter", "source"] | None = None


def _letters(gateway: Gateway, tenant: str, redriven_by: str = "") -> DeadLetters:
    settings = gateway.cells.get(tenant).settings
    return DeadLetters(settings, redriven_by=redriven_by, read_timeout_s=10.0,
                       targets=redrivable_topics(Topics(prefix=settings.topic_prefix)))


def _forbidden(exc: Exception) -> Problem:
    return Problem(403, f"the gateway's Kafka principal may not do this ({type(exc).__name__}); see "
                        "docs/gateway.md, \"Dead letters\"", slug="forbidden")


@router.get("/dead-letters", response_model=DeadLetterList, tags=["dead letters"],
            summary="The cell's dead letters, oldest first (operator)")
async def list_letters(principal: Operator, gateway: GatewayDep,
                       kind: Annotated[DeadLetterKind | None, Query(description="Only this error kind.")] = None,
                       source_topic: Annotated[str | None, Query(max_length=249, description=(
                           "Only letters of records from this topic."))] = None,
                       limit: Annotated[int, Query(ge=0, le=1000, description="The most recent N matching letters "
                                                                              "(0: all, up to 1000).")] = 50,
                       ) -> DeadLetterList:
    """As ``agentstream dlq list``: where each record came from, which service gave up on it and why. A
    cell whose dead-letter topic does not exist yet has none."""
    try:
        async with _letters(gateway, principal.tenant) as letters:
            stored = await letters.list(kind=kind, source_topic=source_topic, limit=limit or 1000)
    except DeadLetterError:
        return DeadLetterList(letters=[])  # no dead-letter topic in this cell (yet)
    except (TopicAuthorizationFailedError, GroupAuthorizationFailedError) as exc:
        raise _forbidden(exc) from exc
    return DeadLetterList(letters=[DeadLetterSummary(**s.summary()) for s in stored])


@router.get("/dead-letters/{offset}", response_model=DeadLetterView, tags=["dead letters"],
            summary="One dead letter, whole (operator)")
async def show_letter(offset: LetterId, principal: Operator, gateway: GatewayDep) -> DeadLetterView:
    """As ``agentstream dlq show``: the letter, its headers and value, the original event decoded when it
    decodes, and the re-drives recorded so far."""
    try:
        async with _letters(gateway, principal.tenant) as letters:
            details = await letters.show(offset)
    except DeadLetterError as exc:
        raise Problem(404, f"no dead letter {offset}: {exc}", slug="dead-letter-not-found") from exc
    except (TopicAuthorizationFailedError, GroupAuthorizationFailedError) as exc:
        raise _forbidden(exc) from exc
    return DeadLetterView(**details.as_dict())


@router.post("/dead-letters/{offset}/redrive", response_model=RedriveView, tags=["dead letters"],
             summary="Republish a dead letter's record to its source topic (operator)",
             responses={409: COMMON_RESPONSES[422] | {"description": "The letter cannot be re-driven"},
                        502: COMMON_RESPONSES[503] | {"description": "Publishing the copy failed"}})
async def redrive_letter(offset: LetterId, principal: Operator, gateway: GatewayDep,
                         body: RedriveRequest | None = None) -> RedriveView:
    """As ``agentstream dlq redrive OFFSET``: the original value, key and headers (plus
    ``agentstream-redrive`` naming the letter) to the source topic and partition, once unless ``force``."""
    body = body or RedriveRequest()
    try:
        async with _letters(gateway, principal.tenant, principal.approver_name) as letters:
            (result,) = await letters.redrive([offset], dry_run=body.dry_run, force=body.force)
    except (TopicAuthorizationFailedError, GroupAuthorizationFailedError) as exc:
        raise _forbidden(exc) from exc
    return _answer(result)


def _answer(result: RedriveResult) -> RedriveView:
    if result.action == "refused":
        if result.detail.startswith(f"letter {result.offset}: there is no "):  # (not a source topic's)
            raise Problem(404, f"no dead letter {result.offset}: {result.detail}", slug="dead-letter-not-found")
        raise Problem(409, result.detail, slug="redrive-refused")
    if result.action == "failed":
        if "AuthorizationFailed" in result.detail:  # the secure stack: the gateway may not write that topic
            raise Problem(403, f"the gateway's Kafka principal may not re-drive to {result.source}: {result.detail}; "
                               "see docs/gateway.md, \"Dead letters\"", slug="forbidden")
        raise Problem(502, f"the re-drive's publish failed: {result.detail}", slug="redrive-failed")
    return RedriveView(offset=result.offset, action=result.action, detail=result.detail, source=result.source,
                       target_offset=result.target_offset, value_from=result.value_from)


__all__ = ["DeadLetterList", "DeadLetterSummary", "DeadLetterView", "RedriveRequest", "RedriveView", "router"]
