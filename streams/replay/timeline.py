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

The cross-check reads, for every event row with a topic/partition/offset, that record back from Kafka
and checks it decodes to the same ``event_id``: one consumer, offsets grouped per partition into spans,
one seek per span (records of other runs in between are skipped undecoded).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeAlias

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from asyncpg.pool import PoolConnectionProxy

from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError, UnknownSchema
from agentstream.streams.core.kinds import TERMINAL_STATUSES, StepKind, StepStatus
from agentstream.streams.core.task_rules import MAX_EVENT_ID_CHARS
from agentstream.streams.kafka.codec import Codec, codec_for
from agentstream.streams.store.history import RunColumns, event_uuid

SERVICE_OF = {"model": "inference", "tool": "tools", "retrieval": "retrieval", "prefetch": "retrieval"}
LANES = ("planner", "inference", "tools", "retrieval")
REQUESTS = frozenset({"InferenceRequested", "ToolCallRequested", "RetrievalRequested"})
RESULTS = frozenset({"InferenceCompleted", "ToolCallCompleted", "RetrievalCompleted"})
#: Planner inputs that lead to a transition (results of the prefetch lead to none visible here).
PLANNER_INPUTS = RESULTS | {"TaskSubmitted", "ApprovalDecided", "RunCancelRequested"}
#: Offsets of one partition further apart than this are read as separate spans (one seek each).
SPAN_GAP = 500

#: What the cross-check found for an event: ``unrecorded`` when its row has no offset.
KafkaCheck: TypeAlias = Literal["verified", "missing", "mismatched", "unrecorded", "unchecked"]
#: A bar of the chart: time in a queue, at work, on the way back to the planner, or the planner's own.
SpanKind: TypeAlias = Literal["queue", "compute", "transport", "planner"]


class RunRecord(RunColumns):
    """The run's row of ``runs`` (what the timeline shows of it)."""

    replay_of: str | None


def ms(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds() * 1000


@dataclass
class EventInfo:
    event_id: str
    step_id: str | None
    event_type: str
    topic: str
    partition: int | None
    offset: int | None
    produced_at: datetime
    appended_at: datetime | None
    consumed_at: datetime | None
    consumed_by: str | None
    payload: dict[str, Any] | None = None
    kafka: KafkaCheck = "unchecked"
    kafka_note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in self.__dict__.items()
                if k != "payload"}


@dataclass
class Step:
    index: int
    kind: StepKind
    step_id: str
    status: StepStatus
    request: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    requested_at: datetime
    completed_at: datetime | None
    sent_at: datetime | None = None  # request appended to Kafka
    picked_at: datetime | None = None  # request consumed by the service
    done_at: datetime | None = None  # result created by the service
    result_sent_at: datetime | None = None  # result appended to Kafka
    returned_at: datetime | None = None  # result consumed by the planner

    @property
    def service(self) -> str:
        return SERVICE_OF.get(self.kind, self.kind)

    @property
    def from_prefetch(self) -> bool:
        return bool(self.request.get("from_prefetch"))

    @property
    def queue_ms(self) -> float | None:
        return ms(self.sent_at, self.picked_at)

    @property
    def compute_ms(self) -> float | None:
        return ms(self.picked_at, self.done_at)

    @property
    def transport_ms(self) -> float | None:
        return ms(self.result_sent_at, self.returned_at)

    @property
    def total_ms(self) -> float | None:
        return ms(self.requested_at, self.completed_at)

    def usage(self, key: str) -> float:
        return float((self.result or {}).get(key) or 0) if self.kind == "model" else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The step for JSON and for streams/replay/diff.py."""
        out = {"index": self.index, "kind": self.kind, "service": self.service, "step_id": self.step_id,
               "status": self.status, "request": self.request, "result": self.result, "error": self.error,
               "from_prefetch": self.from_prefetch}
        for name in ("queue_ms", "compute_ms", "transport_ms", "total_ms"):
            value = getattr(self, name)
            out[name] = None if value is None else round(value, 3)
        for name in ("requested_at", "completed_at", "sent_at", "picked_at", "done_at", "result_sent_at",
                     "returned_at"):
            value = getattr(self, name)
            out[name] = value.isoformat() if value else None
        return out


@dataclass(frozen=True)
class Span:
    """One bar of the Gantt chart, in ms since the run was submitted."""

    lane: str
    kind: SpanKind
    start_ms: float
    end_ms: float
    step: int | None
    label: str


@dataclass
class Budget:
    wall_ms: float
    transport_ms: float  # Kafka hops and queues: task hop + Σ (queue + transport back)
    compute_ms: float
    planner_ms: float

    @property
    def other_ms(self) -> float:
        return max(0.0, self.wall_ms - self.transport_ms - self.compute_ms - self.planner_ms)

    def share(self, value: float) -> float:
        return value / self.wall_ms if self.wall_ms > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        parts = {"transport_and_queues": self.transport_ms, "compute": self.compute_ms,
                 "planner": self.planner_ms, "other": self.other_ms}
        return {"wall_ms": round(self.wall_ms, 3),
                **{f"{k}_ms": round(v, 3) for k, v in parts.items()},
                **{f"{k}_share": round(self.share(v), 4) for k, v in parts.items()}}


@dataclass
class Timeline:
    run: RunRecord
    steps: list[Step]
    events: list[EventInfo]
    planner: list[Span] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)  # how long loading and checking took

    @property
    def start(self) -> datetime:
        return self.run["submitted_at"]

    @property
    def end(self) -> datetime:
        return self.run["finished_at"] or self.run["updated_at"]

    @property
    def task(self) -> dict[str, Any]:
        """The TaskSubmitted's fields (task, tools, max_steps, deadline, model, system_prompt, …)."""
        for e in self.events:
            if e.event_type == "TaskSubmitted" and e.payload is not None:
                return e.payload
        return {}

    def kafka_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for e in self.events:
            counts[e.kafka] += 1
        return dict(counts)

    def spans(self) -> list[Span]:
        """Every bar of the chart: planner work, and per service step its queue, compute and transport."""
        t0 = self.start
        out = list(self.planner)
        task = next((e for e in self.events if e.event_type == "TaskSubmitted"), None)
        if task is not None and task.consumed_at is not None:
            out.append(Span("planner", "queue", ms(t0, task.produced_at) or 0.0, ms(t0, task.consumed_at) or 0.0,
                            None, "task → planner"))
        for s in self.steps:
            lane, label = s.service, f"#{s.index} {s.kind}"
            bars: tuple[tuple[SpanKind, datetime | None, datetime | None], ...] = (
                ("queue", s.sent_at, s.picked_at), ("compute", s.picked_at, s.done_at),
                ("transport", s.result_sent_at, s.returned_at))
            for kind, a, b in bars:
                if a is not None and b is not None:
                    out.append(Span(lane, kind, ms(t0, a) or 0.0, ms(t0, b) or 0.0, s.index, label))
        return out

    def budget(self) -> Budget:
        """The speed-of-light budget of the main chain (the prefetch runs beside it)."""
        main = [s for s in self.steps if s.index >= 0]
        task = next((e for e in self.events if e.event_type == "TaskSubmitted"), None)
        hop = max(0.0, ms(task.produced_at, task.consumed_at) or 0.0) if task else 0.0
        return Budget(
            wall_ms=max(0.0, ms(self.start, self.end) or 0.0),
            transport_ms=hop + sum(max(0.0, s.queue_ms or 0.0) + max(0.0, s.transport_ms or 0.0) for s in main),
            compute_ms=sum(max(0.0, s.compute_ms or 0.0) for s in main),
            planner_ms=sum(max(0.0, sp.end_ms - sp.start_ms) for sp in self.planner))

    def totals(self) -> dict[str, Any]:
        models = [s for s in self.steps if s.kind == "model"]
        ttfts = sorted(s.usage("ttft_ms") for s in models if s.result and not s.error)
        return {"prompt_tokens": int(sum(s.usage("prompt_tokens") for s in models)),
                "completion_tokens": int(sum(s.usage("completion_tokens") for s in models)),
                "cached_prompt_tokens": int(sum(s.usage("cached_prompt_tokens") for s in models)),
                "ttft_p50_ms": round(ttfts[len(ttfts) // 2], 3) if ttfts else None}

    def summary(self) -> dict[str, Any]:
        """The run, for diff and window: its outcome and its steps as dicts."""
        return {"run_id": self.run["run_id"], "status": self.run["status"], "answer": self.run["answer"],
                "error_code": self.run["error_code"], "steps": [s.as_dict() for s in self.steps]}

    def as_dict(self) -> dict[str, Any]:
        run = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in self.run.items()}
        return {"run": run, "task": self.task, "totals": self.totals(), "budget": self.budget().as_dict(),
                "kafka": self.kafka_counts(), "steps": [s.as_dict() for s in self.steps],
                "events": [e.as_dict() for e in self.events],
                "spans": [sp.__dict__ for sp in self.spans()], "timings_ms": self.timings}


# -- loading --------------------------------------------------------------------------------------

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


# -- the Kafka cross-check ------------------------------------------------------------------------

async def cross_check(consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient, codec: Codec,
                      events: Sequence[EventInfo], *, timeout_s: float = 5.0) -> None:
    """Set ``kafka`` on every event: verified, missing (deleted topic, retention, compaction), mismatched
    (another event at that offset), or unrecorded (no offset in the row). ``consumer``: started, no group;
    ``admin``: started (it asks for the metadata of these topics only: a cluster may hold thousands)."""
    wanted: dict[TopicPartition, dict[int, EventInfo]] = defaultdict(dict)
    for e in events:
        if e.partition is None or e.offset is None:
            e.kafka = "unrecorded"
        else:
            wanted[TopicPartition(e.topic, e.partition)][e.offset] = e
    if not wanted:
        return
    described = await admin.describe_topics(sorted({tp.topic for tp in wanted}))
    existing = {d["topic"]: {p["partition"] for p in d["partitions"]} for d in described if d["error_code"] == 0}
    tps = []
    for tp, by_offset in wanted.items():
        if tp.partition in existing.get(tp.topic, ()):
            tps.append(tp)
        else:
            _mark(by_offset.values(), "missing", "the topic or partition no longer exists")
    if not tps:
        return
    # Assign before asking for offsets (the consumer then fetches metadata for these topics only), and
    # seek at once: fetching starts while the offsets are asked (one below the log start resets to it).
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, min(wanted[tp]))
    first, last = await asyncio.gather(consumer.beginning_offsets(tps), consumer.end_offsets(tps))
    spans: dict[TopicPartition, list[tuple[int, int]]] = {}
    for tp in tps:
        offsets = []
        for offset, e in wanted[tp].items():
            if offset < first[tp]:
                _mark([e], "missing", f"below the log start offset {first[tp]} (retention)")
            elif offset >= last[tp]:
                _mark([e], "missing", f"at or past the end offset {last[tp]}")
            else:
                offsets.append(offset)
        offsets.sort()
        runs: list[tuple[int, int]] = []
        for o in offsets:
            if runs and o - runs[-1][1] <= SPAN_GAP:
                runs[-1] = (runs[-1][0], o)
            else:
                runs.append((o, o))
        if runs:
            spans[tp] = runs
    if not spans:
        return
    for tp in tps:
        if tp not in spans:
            consumer.pause(tp)
        elif spans[tp][0][0] != min(wanted[tp]):
            consumer.seek(tp, spans[tp][0][0])
    deadline = time.monotonic() + timeout_s
    while spans and time.monotonic() < deadline:
        batch = await consumer.getmany(*spans, timeout_ms=100)
        for tp, messages in batch.items():
            by_offset = wanted[tp]
            for msg in messages:
                found = by_offset.get(msg.offset)
                if found is None or found.kafka != "unchecked":
                    continue
                try:
                    await codec.learn(msg.value)  # written by a process with another version of its schema
                    kind, got = _identify(codec, msg.value)
                except (DecodeError, UnknownSchema, ValueError, IndexError) as exc:
                    _mark([found], "mismatched", f"does not decode: {exc}")
                    continue
                if event_uuid(got) == found.event_id and kind == found.event_type:  # history keeps ids as UUIDs
                    _mark([found], "verified")
                else:
                    _mark([found], "mismatched", f"offset {msg.offset} holds {kind} {got}")
        for tp in list(spans):
            if await consumer.position(tp) > spans[tp][0][1]:
                spans[tp].pop(0)
                if spans[tp]:
                    consumer.seek(tp, spans[tp][0][0])
                else:
                    del spans[tp]
                    consumer.pause(tp)
    for by_offset in wanted.values():
        _mark([e for e in by_offset.values() if e.kafka == "unchecked"], "missing",
              "not found at its offset (compacted, or not read in time)")


def _identify(codec: Codec, data: bytes | None) -> tuple[str, str]:
    """(event type, event id) of a record in our wire format. Every event's writer schema starts with
    ``event_id`` (a string: zig-zag varint length, UTF-8), so the id is read from the front of the
    Avro body instead of decoding whole conversations (a long run's model requests carry them all);
    a writer schema that does not start with it is decoded in full."""
    if not data:
        raise DecodeError("undecodable", "empty value")
    writer = codec.registry.writer_schema(codec.schema_id(data))
    name = str(writer.get("name", "")).rsplit(".", 1)[-1] if isinstance(writer, dict) else ""
    fields = writer.get("fields") if isinstance(writer, dict) else None
    if not fields or fields[0].get("name") != "event_id" or fields[0].get("type") != "string":
        event = codec.decode(data)
        return type(event).__name__, event.event_id
    pos, shift, raw = 5, 0, 0
    while True:
        byte = data[pos]
        raw |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not byte & 0x80:
            break
    length = (raw >> 1) ^ -(raw & 1)
    if not 0 < length <= 4 * MAX_EVENT_ID_CHARS or pos + length > len(data):  # UTF-8: up to 4 bytes a character
        raise ValueError(f"event_id length {length} out of range")
    return name, data[pos:pos + length].decode()


def _mark(events: Iterable[EventInfo], status: KafkaCheck, note: str = "") -> None:
    for e in events:
        e.kafka, e.kafka_note = status, note


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
