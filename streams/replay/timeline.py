"""A run's timeline: its steps and hops from PostgreSQL, each recorded event cross-checked in Kafka.

Where the numbers come from (``events`` rows, filled by the planner, docs/architecture.md):

- a request event (InferenceRequested, ToolCallRequested, RetrievalRequested): ``appended_at`` is its
  Kafka record timestamp (when the planner sent it) and ``consumed_at`` when the service's consumer
  fetched it (both copied from the result's ``agentstream-source`` header);
- a result event: ``produced_at`` is when the service built it (the work was done), ``appended_at`` its
  record timestamp, ``consumed_at`` when the planner fetched it.

So per step: **queue** = request appended → consumed by the service (time in Kafka and in the service's
backlog); **compute** = consumed by the service → result created; **transport back** = result appended
→ consumed by the planner. **Planner** time = a planner input consumed → the request it led to appended
(decode, transition, the PostgreSQL commit, the publish). The *speed-of-light budget* splits the run's
wall time (submitted → finished) into transport+queues, compute, planner, and the rest (approvals,
waits for the prefetch, clock skew between machines). The prefetch runs beside the main chain and is
left out of the budget. Timestamps come from several clocks (producers' record timestamps, consumers'
clocks): on one host they agree; across hosts they are as good as NTP.

The data (``Timeline``, ``Step``, ``Budget``, …) lives in ``agentstream.streams.replay.records``; the
cross-check of each recorded event against Kafka (``show(check=True)``) in
``agentstream.streams.replay.kafka_check``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from asyncpg.pool import PoolConnectionProxy

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.kinds import TERMINAL_STATUSES
from agentstream.streams.kafka.codec import Codec, codec_for
from agentstream.streams.replay.kafka_check import cross_check
from agentstream.streams.replay.records import (
    PLANNER_INPUTS,
    REQUESTS,
    RESULTS,
    EventInfo,
    RunRecord,
    Span,
    Step,
    Timeline,
    ms,
)


async def load(conn: asyncpg.Connection | PoolConnectionProxy, run_id: str) -> Timeline | None:
    """The run's rows from PostgreSQL, joined into steps and planner spans (no Kafka)."""
    run = await conn.fetchrow(
        """SELECT run_id, status, task, step_count, answer, error_code, error, submitted_at, updated_at,
                  finished_at, replay_of FROM runs WHERE run_id = $1""", run_id)
    if run is None:
        return None
    step_rows = await conn.fetch(
        """SELECT step_id, step_index, kind, status, request::text AS request, result::text AS result, error,
                  requested_at, completed_at FROM steps WHERE run_id = $1 ORDER BY step_index""", run_id)
    event_rows = await conn.fetch(
        """SELECT event_id::text AS event_id, step_id, event_type, topic, partition, "offset", produced_at,
                  appended_at, consumed_at, consumed_by,
                  CASE WHEN event_type IN ('TaskSubmitted', 'ApprovalDecided', 'RunCancelRequested')
                       THEN payload::text END AS payload
           FROM events WHERE run_id = $1 ORDER BY produced_at, recorded_at""", run_id)
    events = [EventInfo(**{**dict(r), "payload": json.loads(r["payload"]) if r["payload"] else None})
              for r in event_rows]
    steps = [Step(index=r["step_index"], kind=r["kind"], step_id=r["step_id"], status=r["status"],
                  request=json.loads(r["request"]), result=json.loads(r["result"]) if r["result"] else None,
                  error=r["error"], requested_at=r["requested_at"], completed_at=r["completed_at"])
             for r in step_rows]
    by_step = {s.step_id: s for s in steps}
    for e in events:
        step = by_step.get(e.step_id or "")
        if step is None:
            continue
        if e.event_type in REQUESTS:
            step.sent_at, step.picked_at = e.appended_at, e.consumed_at
        elif e.event_type in RESULTS:
            step.done_at, step.result_sent_at, step.returned_at = e.produced_at, e.appended_at, e.consumed_at
    record = RunRecord(run_id=run["run_id"], status=run["status"], task=run["task"], step_count=run["step_count"],
                       answer=run["answer"], error_code=run["error_code"], error=run["error"],
                       submitted_at=run["submitted_at"], updated_at=run["updated_at"],
                       finished_at=run["finished_at"], replay_of=run["replay_of"])
    timeline = Timeline(run=record, steps=steps, events=events)
    timeline.planner = _planner_spans(timeline)
    return timeline


def _planner_spans(tl: Timeline) -> list[Span]:
    """Planner busy time: from each input it consumed to the last request that transition sent (or,
    for the final transition, to the run's end)."""
    t0 = tl.start
    inputs = sorted((e for e in tl.events if e.consumed_by == "planner" and e.consumed_at is not None
                     and e.event_type in PLANNER_INPUTS and not (e.step_id or "").endswith(":prefetch")),
                    key=lambda e: e.consumed_at or t0)  # never None here: filtered above
    ends: dict[int, datetime] = {}
    for r in tl.events:
        if r.event_type not in REQUESTS or r.appended_at is None:
            continue
        i = _last_before(inputs, r.produced_at)
        if i is not None:
            ends[i] = max(ends.get(i, r.appended_at), r.appended_at)
    if tl.run["status"] in TERMINAL_STATUSES:
        i = _last_before(inputs, tl.end)
        if i is not None:
            ends[i] = max(ends.get(i, tl.end), tl.end)
    return [Span("planner", "planner", ms(t0, inputs[i].consumed_at) or 0.0, ms(t0, end) or 0.0, None,
                 f"planner: {inputs[i].event_type}") for i, end in sorted(ends.items())]


def _last_before(inputs: Sequence[EventInfo], at: datetime) -> int | None:
    found = None
    for i, e in enumerate(inputs):
        if e.consumed_at is not None and e.consumed_at <= at:
            found = i
        else:
            break
    return found


async def show(settings: Settings, run_id: str, *, check: bool = True, codec: Codec | None = None) -> Timeline | None:
    """Load the run's timeline and (``check``) cross-check its events in Kafka. The Kafka clients connect
    while PostgreSQL answers, so the two round-trip chains overlap."""
    started = time.perf_counter()
    own_codec = codec is None and check
    codec = codec or (codec_for(settings) if check else None)
    consumer = AIOKafkaConsumer(**settings.kafka_options(), enable_auto_commit=False,
                                auto_offset_reset="earliest", fetch_max_wait_ms=20, consumer_timeout_ms=20,
                                client_id="agentstream-replay-show") if check else None
    admin = AIOKafkaAdminClient(**settings.kafka_options(),
                                client_id="agentstream-replay-show") if check else None
    clients = [c for c in (consumer, admin) if c is not None]
    connecting = asyncio.gather(*(c.start() for c in clients))
    try:
        conn = await asyncpg.connect(settings.database_url)  # no vectors here: skip db.connect's codec set-up
        try:
            timeline = await load(conn, run_id)
        finally:
            await conn.close()
        loaded = time.perf_counter()
        if timeline is None or consumer is None or admin is None or codec is None:
            return timeline
        await connecting
        await cross_check(consumer, admin, codec, timeline.events)
        timeline.timings = {"database_ms": round((loaded - started) * 1000, 2),
                            "total_ms": round((time.perf_counter() - started) * 1000, 2)}
        return timeline
    finally:
        if not connecting.done():
            connecting.cancel()
        await asyncio.gather(connecting, return_exceptions=True)
        if consumer is not None:
            await consumer.stop()
        if admin is not None:
            await admin.close()
        if own_codec and codec is not None:
            await codec.close()


async def summaries(pool: asyncpg.Pool, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Several runs' ``Timeline.summary()`` from one pool (diff and window; no Kafka)."""
    async def one(run_id: str) -> tuple[str, dict[str, Any] | None]:
        async with pool.acquire() as conn:
            tl = await load(conn, run_id)
        return run_id, tl.summary() if tl is not None else None

    found = await asyncio.gather(*(one(r) for r in run_ids))
    return {r: s for r, s in found if s is not None}


__all__ = ["load", "show", "summaries"]
