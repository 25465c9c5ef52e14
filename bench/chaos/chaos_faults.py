"""The chaos suite's faults: the schedule, and what each fault does.

Every kind of fault happens in every mode (``--quick`` shortens them and lets them overlap):

- ``sigkill``: SIGKILL one worker, start it again a moment later; in rounds, so every service (planner,
  inference, tools, retrieval) is killed several times, alternating between its two instances;
- ``scale_up`` / ``scale_down``: a third planner joins, later leaves (SIGTERM, a graceful stop);
- ``pause``: SIGSTOP a planner for longer than the session timeout, then SIGCONT: its partitions have
  moved on meanwhile and it wakes up believing it still owns them;
- ``postgres_outage``: ``pg_ctl stop -m fast``, then start it again;
- ``broker_kill``: SIGKILL the Kafka broker, restart it on its data (on a three-node cluster, ``--secure``:
  one node, and later the node leading the metadata quorum: the active controller);
- ``model_outage``: SIGKILL the model server, restart it later;
- ``poison``: records no service can use, into every input topic (``chaos_poison``).

A fault's *end* is when the suite has undone it (the process restarted, SIGCONT sent, the server
answering again); its recovery is measured from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient

from agentstream.devstack.private import PrivateStack
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from bench.chaos.chaos_procs import Supervisor

SERVICES = ("planner", "inference", "tools", "retrieval")
MODEL_SERVER = "model-server"
SCALE_PLANNER = "planner-3"
#: The ``broker_kill`` target that means the node leading the KRaft metadata quorum when the fault begins.
CONTROLLER = "controller"


@dataclass(frozen=True, kw_only=True)
class Timings:
    """How long faults last and how they are spaced (seconds)."""

    lead_in_s: float  # load before the first fault
    settle_s: float  # between one fault's end and the next one's start
    kill_down_s: float  # a killed worker stays down this long
    broker_down_s: float
    pause_s: float  # SIGSTOP → SIGCONT (must exceed the session timeout)
    outage_s: float  # PostgreSQL and the model server
    kill_rounds: int  # every service is killed this many times
    #: Fraction of a fault's hold the next fault may overlap (0: strictly one after another).
    overlap: float = 0.0
    #: A guess at how long the broker and PostgreSQL take to start, for spacing only.
    restart_guess_s: float = 8.0


FULL = Timings(lead_in_s=5, settle_s=6, kill_down_s=3, broker_down_s=3, pause_s=15, outage_s=30, kill_rounds=3)
QUICK = Timings(lead_in_s=2, settle_s=0.5, kill_down_s=2, broker_down_s=2, pause_s=8, outage_s=10, kill_rounds=2,
                overlap=0.7, restart_guess_s=4.0)


@dataclass(frozen=True)
class FaultStep:
    at_s: float  # after the load started
    kind: str
    target: str = ""
    hold_s: float = 0.0

    @property
    def label(self) -> str:
        return f"{self.kind} {self.target}".strip()


def build_plan(t: Timings, brokers: int = 1) -> list[FaultStep]:
    """The schedule: poison, a kill round, scale up, pause, PostgreSQL outage, a kill round, broker kill,
    model server outage, (on a cluster of ``brokers`` nodes: the controller's kill,) scale down, then the
    remaining kill rounds. Each step starts after the previous one's hold (less the overlap) and
    ``settle_s``."""
    steps: list[FaultStep] = []
    cursor = t.lead_in_s

    def add(kind: str, target: str = "", hold: float = 0.0, takes: float = 0.0) -> None:
        nonlocal cursor
        steps.append(FaultStep(round(cursor, 2), kind, target, hold))
        cursor += (hold + takes) * (1 - t.overlap) + t.settle_s

    def kill_round(n: int) -> None:
        for service in SERVICES:
            add("sigkill", f"{service}-{n % 2 + 1}", t.kill_down_s)

    add("poison")
    kill_round(0)
    add("scale_up", SCALE_PLANNER)
    add("pause", "planner-2", t.pause_s)
    add("postgres_outage", "postgresql", t.outage_s, t.restart_guess_s)
    kill_round(1)
    # One broker is the whole cluster on the default stack; on a cluster, a follower node first and the
    # metadata quorum's leader (the active controller) later, each a broker of some partitions' leaders.
    add("broker_kill", "kafka" if brokers == 1 else "node-2", t.broker_down_s, t.restart_guess_s)
    add("model_outage", MODEL_SERVER, t.outage_s)
    if brokers > 1:
        add("broker_kill", CONTROLLER, t.broker_down_s, t.restart_guess_s)
    add("scale_down", SCALE_PLANNER)
    for n in range(2, t.kill_rounds):
        kill_round(n)
    return steps


def plan_length_s(steps: list[FaultStep], t: Timings) -> float:
    """When the last fault should be over (a lower bound: restarts take what they take)."""
    return max(s.at_s + s.hold_s + (t.restart_guess_s if s.kind in ("broker_kill", "postgres_outage") else 0)
               for s in steps)


@dataclass
class FaultRecord:
    label: str
    kind: str
    target: str
    planned_s: float
    started: float = 0.0  # wall time
    ended: float | None = None
    error: str | None = None
    detail: dict = field(default_factory=dict)


@dataclass
class FaultRunner:
    """Carries out the schedule against the suite's own stack and processes."""

    stack: PrivateStack
    sup: Supervisor
    inject_poison: Callable[[], Awaitable[dict]]
    #: Waits until the model server answers again after a restart.
    model_ready: Callable[[], Awaitable[None]]
    stop_grace_s: float
    records: list[FaultRecord] = field(default_factory=list)
    _broker_faults: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def run(self, steps: list[FaultStep], origin: float) -> None:
        """Each step at its time, concurrently (steps may overlap); returns when all are over."""
        await asyncio.gather(*(self._at(step, origin) for step in steps))

    async def _at(self, step: FaultStep, origin: float) -> None:
        await asyncio.sleep(max(0.0, origin + step.at_s - time.monotonic()))
        record = FaultRecord(step.label, step.kind, step.target, step.at_s, started=time.time())
        self.records.append(record)
        try:
            record.detail = await getattr(self, f"_{step.kind}")(step) or {}
        except Exception as exc:  # a fault the suite could not carry out is reported, not fatal
            record.error = f"{type(exc).__name__}: {exc}"
        record.ended = time.time()

    async def _sigkill(self, step: FaultStep) -> dict:
        await self.sup.kill(step.target)
        await asyncio.sleep(step.hold_s)
        self.sup.start(step.target)
        return {}

    async def _scale_up(self, step: FaultStep) -> dict:
        self.sup.start(step.target)
        return {}

    async def _scale_down(self, step: FaultStep) -> dict:
        return {"returncode": await self.sup.stop(step.target, self.stop_grace_s)}

    async def _pause(self, step: FaultStep) -> dict:
        # A worker that crashed on its own may be waiting out its restart backoff: pause it once it is back.
        deadline = time.monotonic() + step.hold_s
        while not self.sup.alive(step.target):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{step.target} was not running for {step.hold_s:.0f} s: nothing to pause")
            await asyncio.sleep(0.1)
        self.sup.signal(step.target, signal.SIGSTOP)
        try:
            await asyncio.sleep(step.hold_s)
        finally:
            if self.sup.alive(step.target):  # an overlapping kill may have ended it meanwhile
                self.sup.signal(step.target, signal.SIGCONT)
        return {}

    async def _postgres_outage(self, step: FaultStep) -> dict:
        await self.stack.stop_postgres()
        await asyncio.sleep(step.hold_s)
        t0 = time.monotonic()
        await self.stack.start_postgres()
        return {"restart_s": round(time.monotonic() - t0, 2)}

    async def _broker_kill(self, step: FaultStep) -> dict:
        """SIGKILL a node (``kafka``: the only one; ``node-N``; ``controller``: the quorum's leader now),
        start it again on its data after the hold; returns once the cluster lists it again. On a cluster,
        one node at a time, each only once every partition is fully replicated again: a second node lost
        before the first has caught up leaves partitions under ``min.insync.replicas``, an outage of writes
        that three nodes do not promise to survive."""
        async with self._broker_faults:
            cluster = self.stack.cluster.size > 1
            if cluster:
                await fully_replicated(self.stack.bootstrap, self.stack.auth())
            node = (controller_leader(self.stack) if step.target == CONTROLLER
                    else int(step.target.removeprefix("node-")) if step.target.startswith("node-") else 1)
            await self.stack.kill_kafka(node)
            await asyncio.sleep(step.hold_s)
            t0 = time.monotonic()
            await self.stack.start_kafka()
            detail = {"node": node, "restart_s": round(time.monotonic() - t0, 2)}
            if cluster:
                await fully_replicated(self.stack.bootstrap, self.stack.auth())
                detail["replicated_s"] = round(time.monotonic() - t0, 2)
            return detail

    async def _model_outage(self, step: FaultStep) -> dict:
        await self.sup.kill(step.target)
        await asyncio.sleep(step.hold_s)
        self.sup.start(step.target)
        await self.model_ready()
        return {}

    async def _poison(self, step: FaultStep) -> dict:
        return await self.inject_poison()


def controller_leader(stack: PrivateStack) -> int:
    """The node that leads the KRaft metadata quorum, as the live nodes last recorded it: each node keeps
    the leader and epoch it knows in ``__cluster_metadata-0/quorum-state``; the highest epoch is the news.
    (aiokafka has no DescribeQuorum, and a broker's metadata names a random node as "controller".)"""
    best: tuple[int, int] | None = None
    for n, node in enumerate(stack.cluster.nodes, start=1):
        if stack.kafka_pid(n) is None:
            continue
        path = node.data_dir / "__cluster_metadata-0" / "quorum-state"
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if int(state.get("leaderId", -1)) > 0 and (best is None or int(state["leaderEpoch"]) > best[0]):
            best = (int(state["leaderEpoch"]), int(state["leaderId"]))
    if best is None:
        raise RuntimeError("no live node has recorded a metadata quorum leader")
    return best[1]


async def fully_replicated(bootstrap: str, auth: KafkaAuth | None = None, timeout: float = 120) -> None:
    """Until every partition of every topic has all its replicas in sync."""
    deadline = time.monotonic() + timeout
    admin = AIOKafkaAdminClient(**kafka_options(bootstrap, auth or KafkaAuth()))
    await admin.start()
    try:
        while True:
            with contextlib.suppress(Exception):
                names = list(await admin.list_topics())
                described = await admin.describe_topics(names)
                if all(len(p["isr"]) == len(p["replicas"]) for t in described for p in t["partitions"]):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("partitions still under-replicated")
            await asyncio.sleep(0.5)
    finally:
        await admin.close()
