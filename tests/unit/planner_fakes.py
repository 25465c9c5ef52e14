"""An in-memory planner: the real ``Planner`` over an in-memory history store, tool catalogue and broker.

- ``MemoryHistory``: the part of ``streams/store/history.py``'s ``TransitionStore`` the planner calls, with
  its rules: a transition under a lease older than the partition's current epoch is ``Fenced``; one whose
  version check fails (a new run that exists, an update from another version) is a ``VersionConflict``;
  states are stored as JSON text, as PostgreSQL returns them. ``transitions`` keeps every write.
- ``MemoryCatalog``: the tools a ``ToolCatalog`` would have read from ``agent.tools``.
- ``PlannerRig``: a ``Planner`` whose runtime sends to a ``FakeKafka`` (tests/unit/fakes.py): ``take``
  leases partitions as an assignment would, ``feed`` hands the handler one event as the consumer runtime
  would (a record, a ``Context``; what it emitted is flushed), ``sent`` decodes what went out.

Self-contained (the fakes import nothing from the tests but ``fakes.py``), so they can move into a
harness users import.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import TopicPartition

from agentstream.services.planner.service import Planner
from agentstream.services.planner.state import RunState
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import VersionConflict
from agentstream.streams.core.events import Event
from agentstream.streams.core.signals import Fenced
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, Record
from agentstream.streams.store.history import Lease, Transition, to_json
from agentstream.streams.store.sessions import SessionRow, SessionWrite, TurnRef

from .fakes import FakeKafka

TERMINAL = ("completed", "failed")


@dataclass
class StoredRun:
    state: str
    status: str
    version: int
    updated_at: datetime
    prefix: str
    #: The epoch of the lease the last transition was written under (None: unfenced).
    epoch: int | None = None


@dataclass
class MemoryHistory:
    runs: dict[str, StoredRun] = field(default_factory=dict)
    #: (prefix, partition) -> its current epoch.
    epochs: dict[tuple[str, int], int] = field(default_factory=dict)
    #: (run id, step id) -> (approved, reason, decided by), as an approver's login records them.
    decisions: dict[tuple[str, str], tuple[bool, str, str]] = field(default_factory=dict)
    transitions: list[Transition] = field(default_factory=list)
    #: (prefix, session id) -> the session's row (streams/store/sessions.py).
    sessions: dict[tuple[str, str], SessionRow] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=lambda: {"batches": 0, "transitions": 0, "flush_s": 0.0})

    async def load_state(self, run_id: str) -> str | None:
        run = self.runs.get(run_id)
        return run.state if run is not None else None

    async def active_states(self, topic_prefix: str = "") -> list[str]:
        return [r.state for r in self.runs.values() if r.status not in TERMINAL and r.prefix == topic_prefix]

    async def active_count(self, topic_prefix: str = "") -> int:
        return len(await self.active_states(topic_prefix))

    async def write(self, transition: Transition) -> None:
        row = transition.run
        lease = transition.lease
        if lease is not None and self.epochs.get((lease.prefix, lease.partition)) != lease.epoch:
            raise Fenced(f"run {row.run_id}: this planner's lease on its partition was taken over")
        stored = self.runs.get(row.run_id)
        if (stored is not None) if row.expected_version is None else (stored is None
                                                                      or stored.version != row.expected_version):
            raise VersionConflict(f"run {row.run_id} moved on concurrently")
        self.runs[row.run_id] = StoredRun(state=to_json(row.state), status=row.status, version=row.version,
                                          updated_at=row.updated_at, prefix=row.state.get("topic_prefix") or "",
                                          epoch=lease.epoch if lease is not None else None)
        self.transitions.append(transition)
        self.stats["transitions"] += 1
        if transition.session is not None:
            self._write_session(transition.session)

    async def acquire_lease(self, prefix: str, partition: int, owner: str) -> Lease:
        epoch = self.epochs.get((prefix, partition), 0) + 1
        self.epochs[(prefix, partition)] = epoch
        return Lease(prefix, partition, epoch)

    async def lease_is_current(self, lease: Lease) -> bool:
        return self.epochs.get((lease.prefix, lease.partition)) == lease.epoch

    async def recorded_decision(self, run_id: str, step_id: str) -> tuple[bool, str, str] | None:
        return self.decisions.get((run_id, step_id))

    async def load_session(self, topic_prefix: str, session: str) -> SessionRow | None:
        return self.sessions.get((topic_prefix, session))

    async def session_with_turns(self, topic_prefix: str, session: str) -> tuple[SessionRow | None, list[TurnRef]]:
        return await self.load_session(topic_prefix, session), await self.session_turns(topic_prefix, session)

    async def session_turns(self, topic_prefix: str, session: str) -> list[TurnRef]:
        going = []
        for run_id, run in self.runs.items():
            state = json.loads(run.state)
            if run.status not in TERMINAL and run.prefix == topic_prefix and state.get("session") == session:
                going.append(TurnRef(run_id=run_id, status=run.status, seq=state.get("session_seq") or 0))  # type: ignore[arg-type]
        return sorted(going, key=lambda t: t.seq)

    def delete_session(self, topic_prefix: str, session: str) -> None:
        """What ``agentstream_delete_session`` does: the turns erased, the epoch moved on."""
        row = self.sessions[(topic_prefix, session)]
        self.sessions[(topic_prefix, session)] = replace(row, turns=[], dropped=0, tokens=0, epoch=row.epoch + 1,
                                                         deleted_at=datetime.now(UTC))

    def _write_session(self, write: SessionWrite) -> None:
        """The sessions part of ``agentstream_record_transitions`` (migration 0018)."""
        key = (write.prefix, write.session_id)
        row = self.sessions.get(key)
        if write.kind == "open":
            if row is None:
                self.sessions[key] = SessionRow(session_id=write.session_id, prefix=write.prefix, epoch=0, turns=[],
                                                dropped=0, tokens=0, created_at=write.at, updated_at=write.at,
                                                last_run_id=write.run_id)
            elif row.deleted_at is not None:
                self.sessions[key] = replace(row, deleted_at=None, updated_at=write.at)
        elif row is not None and row.epoch == write.epoch:
            self.sessions[key] = replace(row, turns=list(write.turns), dropped=write.dropped, tokens=write.tokens,
                                         last_run_id=write.run_id, updated_at=write.at)

    async def stalled(self, topic_prefix: str, *, idle_s: float) -> list[str]:
        now = datetime.now(UTC)
        out = []
        for run in self.runs.values():
            if run.status in TERMINAL or run.prefix != topic_prefix:
                continue
            state = json.loads(run.state)
            limits = [datetime.fromisoformat(state[k]) for k in ("deadline", "expires_at") if state.get(k)]
            if ((run.status == "running" and run.updated_at < now - timedelta(seconds=idle_s))
                    or any(t <= now for t in limits)):
                out.append(run.state)
        return out

    def state(self, run_id: str) -> RunState:
        """The run's recorded state."""
        return RunState.from_json(self.runs[run_id].state)


class MemoryCatalog:
    def __init__(self, *tools: ToolInfo) -> None:
        self.tools = {t.name: t for t in tools}

    async def unknown(self, names: list[str]) -> list[str]:
        return [n for n in names if n not in self.tools]

    async def describe(self, names: list[str]) -> list[ToolInfo]:
        return [self.tools[n] for n in names if n in self.tools]

    async def close(self) -> None:
        pass


def settings(**changes: Any) -> Settings:
    """Settings for a planner on the fake broker (one partition unless ``partitions`` says otherwise)."""
    return Settings(**{"kafka_bootstrap": "fake:1", "database_url": "unused", "partitions": 1, **changes})


CALCULATOR = ToolInfo("calculator", "Evaluate arithmetic.",
                      {"type": "object", "properties": {"expression": {"type": "string"}}})
WIRE_MONEY = ToolInfo("wire_money", "Send money.", {"type": "object"}, requires_approval=True)


class PlannerRig:
    """A ``Planner`` on ``kafka`` and ``store`` (shared by the rigs of one test: two planners of a group)."""

    def __init__(self, kafka: FakeKafka, store: MemoryHistory, settings: Settings, **planner: Any) -> None:
        self.kafka = kafka
        self.store = store
        codec = Codec(LocalRegistry())
        # The runtime's producer is the fake broker's (the module that defines Runtime creates it).
        runtime_module = sys.modules[Runtime.__module__]
        real = runtime_module.AIOKafkaProducer  # type: ignore[attr-defined]
        runtime_module.AIOKafkaProducer = kafka.producer  # type: ignore[attr-defined]
        try:
            self.runtime = Runtime(settings, codec, tracing=None)
        finally:
            runtime_module.AIOKafkaProducer = real  # type: ignore[attr-defined]
        self.topics = self.runtime.topics
        self.planner = Planner(self.runtime, store, MemoryCatalog(CALCULATOR, WIRE_MONEY),  # type: ignore[arg-type]
                               **planner)
        self._offsets = itertools.count()

    async def take(self, *partitions: int) -> None:
        """Assign ``partitions`` of the planner's inputs (as a rebalance would) and wait for their leases."""
        assigned = {TopicPartition(topic, p) for topic in self.topics.planner_inputs for p in partitions}
        await self.planner.leases.on_assigned(assigned)
        await asyncio.gather(*(self.planner.leases.held[p] for p in partitions))

    async def revoke(self, *partitions: int) -> None:
        await self.planner.leases.on_revoked({TopicPartition(self.topics.tasks, p) for p in partitions})

    def context(self, event: Event, *, deferrals: int = 0) -> Context:
        """The context the runtime hands the handler with ``event`` (from its run's partition)."""
        record = Record(topic=self.topics.tasks, partition=self.topics.partition_for(event.run_id),
                        offset=next(self._offsets), key=event.run_id.encode(), timestamp_ms=0, headers={},
                        consumed_at=datetime.now(UTC), deferrals=deferrals)
        return Context(self.runtime, "planner", record)

    async def feed(self, event: Event, *, deferrals: int = 0) -> None:
        """Handle ``event`` as the runtime would, up to the broker's acknowledgement of its outputs."""
        ctx = self.context(event, deferrals=deferrals)
        await self.planner.handle(event, ctx)
        await ctx.flush()

    def sent(self, *, since: int = 0, snapshots: bool = False) -> list[Event]:
        """The events this test's planners published (from the ``since``-th on), snapshots left out unless asked."""
        out = []
        for produced in self.kafka.produced[since:]:
            if produced.topic == self.topics.runs and not snapshots:
                continue
            out.append(self.runtime.codec.decode(produced.value))
        return out


def run_ids(topics: Any, partition: int, count: int = 1, *, prefix: str = "run") -> list[str]:
    """``count`` run ids whose partition is ``partition``."""
    found = (f"{prefix}-{i}" for i in itertools.count())
    return list(itertools.islice((r for r in found if topics.partition_for(r) == partition), count))


def names(events: Iterable[Event]) -> list[str]:
    return [type(e).__name__ for e in events]
