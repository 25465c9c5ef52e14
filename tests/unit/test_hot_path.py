"""The hot path's shortcuts: when the planner publishes a run's state to ``agent.runs``
(services/planner/snapshots.py), and the fast ids, partitions and copies of states and events that do what
``uuid.uuid5``, aiokafka's partitioner, ``dataclasses.replace`` and ``__init__`` did (same results)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest

from agentstream.services.planner import machine
from agentstream.services.planner.snapshots import SnapshotPacer
from agentstream.services.planner.state import RunState
from agentstream.streams.core.events import InferenceRequested, Message, TaskSubmitted
from agentstream.streams.core.ids import _EVENT_NS, event_id_for, uuid5_str
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.store.history import event_uuid

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _state(run_id: str = "r") -> RunState:
    task = TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", created_at=NOW,
                               task="What is 2 + 2?", tools=["calculator"], max_steps=5)
    return machine.start(task, [ToolInfo("calculator", "Arithmetic.", {"type": "object"})], NOW)


def test_a_short_run_publishes_only_its_final_state() -> None:
    pacer = SnapshotPacer(1.0)
    state = _state()
    assert pacer.hold(state, now=0.0) and pacer.hold(state.evolve(), now=0.3)
    assert pacer.due(now=0.5) == []
    done = machine.fail(state, NOW, "internal_error", "x")
    assert not pacer.hold(done, now=0.6)
    assert pacer.due(now=5.0) == [] and pacer.held == 0


def test_a_running_run_is_published_once_an_interval() -> None:
    pacer = SnapshotPacer(1.0)
    state = _state()
    assert pacer.hold(state, now=0.0)
    assert pacer.hold(state.evolve(), now=0.4)  # still one held, due when the first was
    assert pacer.due(now=0.9) == []
    assert pacer.due(now=1.0) == ["r"]
    assert pacer.due(now=1.1) == []  # taken: the planner publishes it and says so
    pacer.sent("r", now=1.05)
    assert pacer.hold(state.evolve(), now=1.5)  # within the interval of the last one
    assert pacer.due(now=2.0) == []
    assert pacer.due(now=2.05) == ["r"]
    pacer.sent("r", now=2.1)
    assert not pacer.hold(state.evolve(), now=3.2)  # a slow step: published with its transition
    assert pacer.held == 0


def test_interval_zero_publishes_every_transition() -> None:
    pacer = SnapshotPacer(0.0)
    state = _state()
    assert not pacer.hold(state, now=0.0) and not pacer.hold(state.evolve(), now=0.0)


def test_changed_is_replace() -> None:
    state = _state()
    assert state.changed(status="failed", step_index=4) == dataclasses.replace(state, status="failed", step_index=4)
    assert state.evolve(answer="4").version == state.version + 1
    with pytest.raises(TypeError, match="no field"):
        state.changed(nonsense=1)


def test_decoded_events_equal_constructed_ones() -> None:
    event = InferenceRequested.build(run_id="r", step="r:0:model", service="planner", created_at=NOW, model="m",
                                     messages=[Message(role="user", content="hi")], max_tokens=5)
    again = InferenceRequested.from_dict(event.to_dict())
    assert again == event and isinstance(again.messages[0], Message)
    partial = {k: v for k, v in event.to_dict().items() if k != "temperature"}  # defaults filled in
    assert InferenceRequested.from_dict(partial) == event


def test_ids_are_uuid5() -> None:
    for name in ("r:0:model|InferenceRequested|0", "é" * 7, ""):
        assert uuid5_str(_EVENT_NS.bytes, name) == str(uuid.uuid5(_EVENT_NS, name))
    assert event_id_for("s", "T", 2) == str(uuid.uuid5(_EVENT_NS, "s|T|2"))
    own = event_id_for("s", "T")
    assert event_uuid(own) == own
    assert event_uuid(own.upper()) == own
    assert uuid.UUID(event_uuid("kafka-7"))  # a foreign id: a UUID of it


def test_key_partitioner_is_kafkas_default() -> None:
    from aiokafka.partitioner import DefaultPartitioner

    from agentstream.streams.kafka.topics import Topics, key_partitioner

    default = DefaultPartitioner()
    for n in range(500):
        key = f"run-{n:016x}".encode()
        partitions = list(range(n % 12 + 1))
        assert key_partitioner(key, partitions, partitions) == default(key, partitions, partitions)
    assert Topics(partitions=8).partition_for("run-0") == default(b"run-0", list(range(8)), [])
    assert key_partitioner(None, [0, 1], [1]) == 1


def test_a_run_waiting_for_a_person_is_published_at_once() -> None:
    pacer = SnapshotPacer(1.0)
    state = _state()
    assert pacer.hold(state, now=0.0)
    assert not pacer.hold(state.evolve(status="awaiting_approval"), now=0.1)
    assert pacer.due(now=2.0) == []


def test_snapshot_interval_setting(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from agentstream.streams.config.settings import Settings
    from agentstream.streams.core.errors import ConfigError

    monkeypatch.setenv("AGENTSTREAM_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("AGENTSTREAM_SNAPSHOT_INTERVAL_MS", raising=False)
    assert Settings.load().snapshot_interval_ms == 1000
    monkeypatch.setenv("AGENTSTREAM_SNAPSHOT_INTERVAL_MS", "0")
    assert Settings.load().snapshot_interval_ms == 0
    monkeypatch.setenv("AGENTSTREAM_SNAPSHOT_INTERVAL_MS", "-5")
    with pytest.raises(ConfigError, match="SNAPSHOT_INTERVAL"):
        Settings.load()


async def test_history_capture_appends_each_batch_document(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """bench/perf/history_write.py replays what ``AGENTSTREAM_HISTORY_CAPTURE`` collects: the very document
    each batch sent, one a line; unset, nothing is written."""
    from agentstream.streams.store import history as store_module

    sent: list[str] = []

    class Writer:  # stands in for the pool: the capture, not PostgreSQL, is under test here
        async def fetchval(self, query: str, doc: str) -> str:
            sent.append(doc)
            return "{}"

    run = store_module.RunRow(run_id="run-1", status="running", task="t", state={"k": "\x00"}, version=1,
                              expected_version=None, step_count=0, answer=None, error_code=None, error=None,
                              traceparent=None, submitted_at=datetime.now(UTC), updated_at=datetime.now(UTC),
                              finished_at=None)
    path = tmp_path / "history.jsonl"
    monkeypatch.setenv(store_module.CAPTURE_ENV, str(path))
    captured = store_module.TransitionStore(None, Writer())  # type: ignore[arg-type]
    await captured.write(store_module.Transition(run=run))
    await captured.write(store_module.Transition(run=dataclasses.replace(run, version=2, expected_version=1)))
    assert path.read_text().splitlines() == sent and len(sent) == 2
    monkeypatch.delenv(store_module.CAPTURE_ENV)
    await store_module.TransitionStore(None, Writer()).write(store_module.Transition(run=run))  # type: ignore[arg-type]
    assert len(path.read_text().splitlines()) == 2 and len(sent) == 3


async def test_history_hooks_are_decided_at_construction(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The store times its writes on the stage clock it is handed (none: no timing), and captures into
    the file it is given, whatever the environment says after it was built."""
    from agentstream.streams.store import history as store_module
    from agentstream.streams.telemetry.stages import StageClock

    class Writer:
        async def fetchval(self, query: str, doc: str) -> str:
            return "{}"

    run = store_module.RunRow(run_id="run-1", status="running", task="t", state={}, version=1,
                              expected_version=None, step_count=0, answer=None, error_code=None, error=None,
                              traceparent=None, submitted_at=datetime.now(UTC), updated_at=datetime.now(UTC),
                              finished_at=None)
    monkeypatch.delenv(store_module.CAPTURE_ENV, raising=False)
    clock = StageClock(tmp_path)
    path = tmp_path / "captured.jsonl"
    store = store_module.TransitionStore(None, Writer(), stages=clock, capture=path)  # type: ignore[arg-type]
    monkeypatch.setenv(store_module.CAPTURE_ENV, str(tmp_path / "elsewhere.jsonl"))
    await store.write(store_module.Transition(run=run))
    assert set(clock.samples) == {"planner.history_write", "planner.history_batch", "planner.history_batch_size"}
    assert len(path.read_text().splitlines()) == 1 and not (tmp_path / "elsewhere.jsonl").exists()
    quiet = store_module.TransitionStore(None, Writer(), capture=None)  # type: ignore[arg-type]
    await quiet.write(store_module.Transition(run=run))
    assert not (tmp_path / "elsewhere.jsonl").exists()
