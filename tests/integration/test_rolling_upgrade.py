"""A rolling upgrade with a schema change while runs are in flight (docs/upgrades.md), on a broker and a
database of the test's own.

The "old" release is the package's schemas; the "new" one adds an optional field to the events that flow
on every run (tests/schema_upgrade.py), given to a process with AGENTSTREAM_SCHEMAS_DIR. Two planners, a
tool worker and an inference worker start old; while an old and a new client submit runs steadily, each
worker is replaced by a new one, one at a time (the new one joins before the old one leaves: maxSurge 1,
maxUnavailable 0), in the order that makes every pair read the other's version: planner A, tools,
inference, planner B. Every run completes, each side effect happens once, nothing is dead-lettered, and
both versions of each changed event were on the topics while the other version's processes read them.

The load uses the fields the conversations issue added (issue 32), so they cross versions too: every
other run is a turn of its client's session (turns move between planners as they are replaced), makes
its two calls in parallel, asks for a structured answer and sets generation settings. Turns of a
session must all complete, in order, and the session's transcript must hold each of them once.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import struct
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.devstack.private import PrivateStack
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.client.outcomes import RunResult
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import DeadLetter
from agentstream.streams.kafka.registry import LocalRegistry
from agentstream.streams.kafka.topic_admin import wait_for_group_coordinator
from agentstream.streams.kafka.topics import Topics
from agentstream.testing import end_offsets, read_events
from tests.integration.processes import private_stack, start_worker, stop, wait_for, wait_for_members
from tests.schema_upgrade import newer_schemas

pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(420)]
TOOLS = ("--tools", "agentstream.services.tools.builtin", "--tools", "tests.integration.pipeline_tools")
TASK = '[[slow:100]] [[tool:effect {"label": "a"}]] [[tool:effect {"label": "b"}]] [[answer:done]]'
#: The same two effects as one parallel call, then a structured answer, as a turn of a session.
TURN = '[[slow:100]] [[tools:effect {"label": "a"} | effect {"label": "b"}]] [[answer:{"done": true}]]'
DONE = {"type": "object", "required": ["done"], "properties": {"done": {"type": "boolean"}}}
#: Replaced in this order, each by a new worker of the same service.
ROLLOUT = (("planner", "planner-a"), ("tools", "tools"), ("inference", "inference"), ("planner", "planner-b"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory) -> AsyncIterator[PrivateStack]:
    async with private_stack(tmp_path_factory.mktemp("private-stack")) as private:
        yield private


class Fleet:
    """Worker processes by name, old or new."""

    def __init__(self, settings: Settings, logs: Path, newer: Path) -> None:
        self.settings, self.logs, self.newer = settings, logs, newer
        self.procs: dict[str, subprocess.Popen] = {}
        self.topics = Topics(settings.topic_prefix, settings.partitions)

    def start(self, service: str, name: str, *, new: bool) -> str:
        label = f"{name}-{'new' if new else 'old'}"
        env = {"AGENTSTREAM_SCHEMAS_DIR": str(self.newer)} if new else {}
        self.procs[label] = start_worker(self.settings, service, self.logs / f"{label}.log",
                                         *(TOOLS if service == "tools" else ()), **env)
        return label

    async def stop(self, label: str) -> None:
        await asyncio.to_thread(stop, self.procs.pop(label))  # SIGTERM: drains, commits, leaves the group

    async def members(self, service: str, count: int) -> None:
        await wait_for_members(self.settings.kafka_bootstrap, self.topics.group(service), count, timeout=120)

    def log(self, label: str) -> str:
        return (self.logs / f"{label}.log").read_text()

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(label) for label in list(self.procs)))


class Load:
    """Runs submitted steadily, alternately by an old and a new client, until ``stop`` is set."""

    def __init__(self, clients: list[AgentClient]) -> None:
        self.clients = clients
        self.run_ids: list[str] = []
        self.turns: dict[str, list[str]] = collections.defaultdict(list)  # session -> its turns, in order
        self.errors: list[str] = []
        self.stop = asyncio.Event()
        self.sessions = [f"upgrade-{uuid.uuid4().hex[:6]}-{i}" for i in range(len(clients))]

    async def submit(self, every_s: float) -> None:
        while not self.stop.is_set():
            n = len(self.run_ids)
            client = self.clients[n % len(self.clients)]
            try:
                if n // len(self.clients) % 2:
                    session = self.sessions[n % len(self.clients)]
                    run_id = await client.submit(TURN, tools=["effect"], max_steps=8, deadline=240, session=session,
                                                 output_schema=DONE, max_tokens=64, temperature=0.3, seed=11)
                    self.turns[session].append(run_id)
                else:
                    run_id = await client.submit(TASK, tools=["effect"], max_steps=8, deadline=240)
                self.run_ids.append(run_id)
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(every_s)

    async def settle(self, runs: int = 4, timeout: float = 120) -> None:
        """Until ``runs`` runs submitted from now on (by both clients) have completed: work went through the
        processes that are members now, rather than a fixed sleep. Each run is awaited by the client that
        submitted it (the test awaits them all again at the end)."""
        first = len(self.run_ids)
        deadline = time.monotonic() + timeout
        while len(self.run_ids) < first + runs:
            assert time.monotonic() < deadline and not self.errors, ("no runs submitted", self.errors)
            await asyncio.sleep(0.05)
        await asyncio.gather(*(self.clients[i % len(self.clients)].wait(self.run_ids[i], timeout=timeout)
                               for i in range(first, first + runs)))


async def _schema_ids(settings: Settings, topics: list[str]) -> dict[str, collections.Counter[int]]:
    """How many records of each topic were written with each schema id."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    counts: dict[str, collections.Counter[int]] = {t: collections.Counter() for t in topics}
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                for record in records:
                    if record.offset < ends[tp] and record.value:
                        counts[tp.topic][struct.unpack_from(">I", record.value, 1)[0]] += 1
    finally:
        await consumer.stop()
    return counts


async def test_a_rolling_upgrade_that_adds_an_optional_field_completes_every_run(stack, tmp_path):
    newer = newer_schemas(tmp_path / "schemas-new")
    settings = stack.settings(topic_prefix=f"u{uuid.uuid4().hex[:8]}.", partitions=4)
    topics = Topics.of(settings)
    fleet = Fleet(settings, tmp_path, newer)
    clients: list[AgentClient] = []
    try:
        for service, name in ROLLOUT:
            fleet.start(service, name, new=False)
        await wait_for_group_coordinator(settings.kafka_bootstrap, auth=settings.kafka_auth)  # a fresh broker: before describing groups
        await asyncio.gather(fleet.members("planner", 2), fleet.members("tools", 1), fleet.members("inference", 1))
        clients = [AgentClient(settings), AgentClient(dataclasses.replace(settings, schemas_dir=newer))]
        for client in clients:
            await client.start()
        load = Load(clients)
        submitting = asyncio.create_task(load.submit(0.25))  # >= 40 runs over a rollout of ~15 s
        started = time.monotonic()
        await load.settle()
        side_by_side: list[float] = []
        for service, name in ROLLOUT:
            count = 2 if service == "planner" else 1
            new = fleet.start(service, name, new=True)
            await fleet.members(service, count + 1)  # maxSurge 1: the new one is in before the old one goes
            joined = time.monotonic()
            await load.settle()  # old and new consume side by side, with runs in flight
            # The old one reads a new-version record before it goes (checked below). Which worker a run
            # reaches is its partition's owner: runs keep coming from both clients, and one of the new
            # client's lands on its partitions within seconds (the new client's session turns all go to
            # one partition, so a fixed number of runs left this to chance: it failed CI once).
            await wait_for(lambda label=f"{name}-old": _learnt(fleet.log(label)), 60, f"{name}-old reading a new schema")
            await fleet.stop(f"{name}-old")
            await fleet.members(service, count)
            side_by_side.append(time.monotonic() - joined)
            assert fleet.procs[new].poll() is None, fleet.log(new)
        await load.settle()
        load.stop.set()
        await submitting
        rollout_s = time.monotonic() - started

        assert load.errors == [], "submit failed during the upgrade"
        assert len(load.run_ids) >= 40
        waited = await asyncio.gather(*(clients[0].wait(r, timeout=60) for r in load.run_ids), return_exceptions=True)
        dlq = TopicPartition(topics.dlq, 0)
        end = (await end_offsets(settings, [dlq]))[dlq]
        if end:
            letters = collections.Counter(f"{e.error_kind} from {e.consumer}"
                                          for e in await read_events(settings, dlq, 0, expect=end)
                                          if isinstance(e, DeadLetter))
            pytest.fail(f"records were dead-lettered during the upgrade: {dict(letters)}")
        results = [r for r in waited if isinstance(r, RunResult)]
        stranded = len(waited) - len(results)
        assert stranded == 0 and [r for r in results if not r.ok] == [], f"{stranded} of {len(waited)} runs stranded"
        conn = await asyncpg.connect(stack.database_url)
        try:
            rows = await conn.fetch("SELECT run_id, label, count(*) AS n FROM test_effects WHERE run_id = ANY($1) "
                                    "GROUP BY run_id, label", load.run_ids)
        finally:
            await conn.close()
        assert {(r["run_id"], r["label"]) for r in rows} == {(r, lbl) for r in load.run_ids for lbl in ("a", "b")}
        assert [(r["run_id"], r["label"], r["n"]) for r in rows if r["n"] != 1] == [], "an effect happened twice"
        turns = {r for rs in load.turns.values() for r in rs}
        assert turns and all(r.output == {"done": True} for r in results if r.run_id in turns)
        for session, run_ids in load.turns.items():  # every turn once, in the order submitted
            details = await clients[0].sessions.show(session)
            assert details is not None
            kept = [t["run_id"] for t in details.row.turns]  # the oldest may have left for the token budget
            assert kept == run_ids[len(run_ids) - len(kept):] and details.row.dropped + len(kept) == len(run_ids)

        # Both versions of every changed event were on its topic: each side read the other's.
        old, new_registry = LocalRegistry(), LocalRegistry(newer)
        changed = {topics.tasks: "TaskSubmitted", topics.inference_requests: "InferenceRequested",
                   topics.inference_results: "InferenceCompleted", topics.tool_requests: "ToolCallRequested",
                   topics.tool_results: "ToolCallCompleted", topics.outcomes: "RunCompleted"}
        counts = await _schema_ids(settings, list(changed))
        versions = {}
        for topic, record in changed.items():
            name = f"io.agentstream.events.{record}"
            versions[record] = (counts[topic][old.id_for(name)], counts[topic][new_registry.id_for(name)])
        assert [r for r, (o, n) in versions.items() if not o or not n] == [], versions
        # Every old worker learnt a new schema from the schemas topic, and every new worker an old one.
        for _service, name in ROLLOUT:
            for label in (f"{name}-old", f"{name}-new"):
                assert "learnt schema" in fleet.log(label), label
        print(f"\nrolling upgrade: {len(load.run_ids)} runs over {rollout_s:.0f} s, every one completed; "
              f"side by side {', '.join(f'{s:.1f}' for s in side_by_side)} s per replacement; records by "
              f"version (old, new): {versions}; run duration max "
              f"{max(r.duration_ms for r in results):.0f} ms, median "
              f"{sorted(r.duration_ms for r in results)[len(results) // 2]:.0f} ms")
    finally:
        for client in clients:
            await client.close()
        await fleet.close()
        await topics.delete_all(settings.kafka_bootstrap, auth=settings.kafka_auth)


async def _learnt(log: str) -> bool:
    return "learnt schema" in log
