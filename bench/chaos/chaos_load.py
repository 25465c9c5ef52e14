"""The chaos suite's load: a steady mix of runs, an approver, a canceller, and a log of outcomes.

Every request the suite makes must itself survive the faults, so each one is retried until the broker
acknowledges it, and each retry is counted. A submit is never duplicated: the suite builds the run's
``TaskSubmitted`` once, with its own run id, and a retry resends that same event (same run id, same event
id), which the planner drops as a copy; a run counts as submitted only once the broker acknowledged it.
(``AgentClient.submit`` picks a new run id per call, so retrying it could start a second run.) Approvals
and cancellations carry deterministic ids too (``AgentClient.approve`` / ``cancel``), so resending them
after an error is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.core.agents import Agent
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import RunCompleted, RunFailed, TaskSubmitted
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.runtime.headers import SESSION_HEADER
from agentstream.streams.telemetry import trace_context as tracing

log = logging.getLogger("chaos")

MAX_STEPS = 8
#: How long one attempt at a broker or database request may take before it is retried.
REQUEST_TIMEOUT_S = 10.0
#: Pause between attempts after an error (the faults last seconds; hammering helps nobody).
RETRY_PAUSE_S = 0.5
#: How often the approver asks which calls wait for approval.
APPROVAL_POLL_S = 0.5


@dataclass(frozen=True)
class RunKind:
    """One kind of run in the mix: its task (scripted-model directives), the outcome it should have,
    and how many side-effect rows a completed run leaves (one per side-effect step)."""

    name: str
    weight: int
    task: str
    tools: tuple[str, ...]
    expect: str  # "completed" or "failed:<error_code>"
    effects: int = 0
    prefetch: bool = False
    #: Seconds after the submit is acknowledged at which the suite cancels the run.
    cancel_after_s: float | None = None
    #: Turns of conversations: each run is a turn of one of this many sessions (0: runs on their own).
    sessions: int = 0
    #: A run of this registered agent (``CHAOS_AGENTS``): the task names it and carries no tools.
    agent: str | None = None


def run_kinds(slow_ms: int, cancel_after_s: float) -> list[RunKind]:
    """The mix: side effects, retrieval (with the speculative prefetch), an approved side effect, a slow
    run cancelled mid-way, the calculator, three side effects at once (parallel calls), and turns of a few
    conversations. ``slow_ms``: the cancelled runs' model time per step,
    several times ``cancel_after_s`` so the cancel lands while the first model step still runs."""
    return [
        RunKind("effects", 35, '[[tool:chaos_effect {"label": "first"}]] '
                '[[tool:chaos_effect {"label": "second"}]] [[answer:done]]', ("chaos_effect",), "completed",
                effects=2),
        RunKind("retrieval", 20, "[[retrieve:kafka partitions keep run events in order]] [[answer:found]]",
                (), "completed", prefetch=True),
        RunKind("approval", 15, '[[tool:chaos_transfer {"amount": 5}]] [[answer:paid]]', ("chaos_transfer",),
                "completed", effects=1),
        RunKind("cancel", 10, f'[[slow:{slow_ms}]] [[tool:chaos_effect {{"label": "late"}}]] [[answer:late]]',
                ("chaos_effect",), "failed:cancelled", cancel_after_s=cancel_after_s),
        RunKind("calculator", 20, "What is 17 * 23?", ("calculator",), "completed"),
        # One model reply with three calls that run side by side (services/planner/fanout.py): each still
        # runs at most once, and the run answers only once all three are back.
        RunKind("parallel", 15, '[[tools:chaos_effect {"label": "p1"} | chaos_effect {"label": "p2"} | '
                'chaos_effect {"label": "p3"}]] [[answer:done]]', ("chaos_effect",), "completed", effects=3),
        # Turns of a few conversations (services/planner/sessions.py): a session's turns run one at a time,
        # in their order on its partition, each once, and every completed one is in its transcript.
        RunKind("session", 10, "[[answer:turn]] and then?", (), "completed", sessions=3),
        # A tree of agents (services/planner/subagents.py): a parent calls two children at once (each a run
        # of its own with one side effect), then hands the conversation to a third agent, which answers.
        RunKind("tree", 10, '[[tools:agent__chaos_child {"task": "one"} | agent__chaos_child {"task": "two"}]] '
                '[[tool:handoff__chaos_closer {}]] [[answer:tree done]]', (), "completed", agent="chaos_parent"),
    ]


#: The agents of the ``tree`` kind, registered by the suite before its load. The child's script is its
#: system prompt (the scripted model plays it when the task has no directives).
CHAOS_AGENTS = (
    Agent(name="chaos_child", system_prompt='[[tool:chaos_effect {"label": "child"}]] [[answer:child done]]',
          tools=["chaos_effect"], max_steps=MAX_STEPS),
    Agent(name="chaos_closer", system_prompt="You close the case.", max_steps=MAX_STEPS),
    Agent(name="chaos_parent", system_prompt="You delegate.", calls=["chaos_child"], handoffs=["chaos_closer"],
          max_steps=MAX_STEPS),
)


@dataclass
class SubmittedRun:
    run_id: str
    kind: RunKind
    created: float  # when the event was built (its deadline counts from here)
    deadline: float
    acked: float | None = None
    attempts: int = 0
    cancel_acked: float | None = None
    session: str | None = None


@dataclass
class LoadStats:
    submit_retries: int = 0
    submits_abandoned: int = 0
    approval_retries: int = 0
    approval_poll_errors: int = 0
    approvals: int = 0
    cancel_retries: int = 0
    cancels: int = 0


async def _retry(what: Callable[[], object], until: float, on_error: Callable[[BaseException], None]) -> bool:
    """Call ``what`` (a coroutine factory) until it succeeds or ``until`` (wall time) passes."""
    while time.time() < until:
        try:
            await asyncio.wait_for(what(), REQUEST_TIMEOUT_S)  # type: ignore[arg-type]
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # broker or database down: that is the point of the suite
            on_error(exc)
            await asyncio.sleep(RETRY_PAUSE_S)
    return False


class Load:
    """Submits the mix at a steady rate, cancels the runs that ask for it, approves waiting calls."""

    def __init__(self, client: AgentClient, kinds: list[RunKind], deadline_s: float, seed: int,
                 approver: AgentClient | None = None) -> None:
        self.client = client
        #: Who lists and approves waiting calls: on a secure stack the cell's approver login (a tenant's
        #: own login may submit and read, not decide).
        self.approver = approver or client
        self.kinds = kinds
        self.deadline_s = deadline_s
        self.random = random.Random(seed)
        self.runs: dict[str, SubmittedRun] = {}
        self.abandoned: list[str] = []
        self.stats = LoadStats()
        self._tasks: set[asyncio.Task] = set()

    def _pick(self) -> RunKind:
        return self.random.choices(self.kinds, weights=[k.weight for k in self.kinds])[0]

    async def submit_for(self, duration_s: float, count: int) -> None:
        """``count`` runs spread evenly over ``duration_s``; each submit runs on its own, so one that waits
        out an outage does not hold back the next."""
        interval = duration_s / max(1, count)
        start = time.monotonic()
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i * interval - time.monotonic()))
            self._spawn(self.submit_one(self._pick()))

    def _spawn(self, coro: object) -> None:
        task = asyncio.create_task(coro)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for every submit and cancel in flight."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def submit_one(self, kind: RunKind) -> SubmittedRun | None:
        """Submit one run of ``kind`` (retrying until acknowledged); cancel it later if its kind says so.
        Returns the run, or None when no attempt was acknowledged before its deadline."""
        session = f"chaos-{self.random.randrange(kind.sessions)}" if kind.sessions else None
        run_id = self.client.topics.run_id_for_session(session) if session else new_run_id()
        now = datetime.now(UTC)
        deadline = now + timedelta(seconds=self.deadline_s)
        event = TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="chaos", task=kind.task,
                                    tools=list(kind.tools), max_steps=MAX_STEPS, deadline=deadline,
                                    metadata={"chaos_kind": kind.name}, prefetch=kind.prefetch or bool(kind.agent),
                                    created_at=now, session=session, agent=kind.agent)
        run = SubmittedRun(run_id, kind, now.timestamp(), deadline.timestamp(), session=session)
        headers = [(tracing.HEADER, tracing.new_traceparent().encode())]
        if session is not None:
            headers.append((SESSION_HEADER, session.encode()))

        async def send() -> None:
            run.attempts += 1
            await (await self.client.runtime.send(self.client.topics.tasks, event, headers=headers))

        def failed(exc: BaseException) -> None:
            self.stats.submit_retries += 1
            log.info("submit %s failed (%s: %s); retrying", run_id, type(exc).__name__, exc)

        if not await _retry(send, run.deadline, failed):
            self.stats.submits_abandoned += 1
            self.abandoned.append(run_id)
            return None
        run.acked = time.time()
        self.runs[run_id] = run
        if kind.cancel_after_s is not None:
            self._spawn(self._cancel_later(run, kind.cancel_after_s))
        return run

    async def _cancel_later(self, run: SubmittedRun, after_s: float) -> None:
        await asyncio.sleep(after_s)
        await self._cancel(run)

    async def _cancel(self, run: SubmittedRun) -> None:
        def failed(exc: BaseException) -> None:
            self.stats.cancel_retries += 1

        if await _retry(lambda: self.client.cancel(run.run_id, "chaos suite: cancelled mid-run"), run.deadline,
                        failed):
            run.cancel_acked = time.time()
            self.stats.cancels += 1

    async def approve_until(self, stop: asyncio.Event) -> None:
        """Approve every call of the suite's runs that waits for approval, once its approval is
        acknowledged. An approval the planner then loses is not sent again: the run would fail by its
        deadline, which is what the suite should see."""
        decided: set[tuple[str, str]] = set()
        while not stop.is_set():
            try:
                waiting = await asyncio.wait_for(self.approver.awaiting_approval(), REQUEST_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.stats.approval_poll_errors += 1
                waiting = []
            for call in waiting:
                key = (call["run_id"], call["step_id"])
                if call["run_id"] in self.runs and key not in decided:
                    await self._approve(key, decided, stop)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), APPROVAL_POLL_S)

    async def _approve(self, key: tuple[str, str], decided: set[tuple[str, str]], stop: asyncio.Event) -> None:
        run_id, step_id = key
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.approver.approve(run_id, step_id, "chaos approver", by="chaos"),
                                       REQUEST_TIMEOUT_S)
                decided.add(key)
                self.stats.approvals += 1
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                self.stats.approval_retries += 1
                await asyncio.sleep(RETRY_PAUSE_S)


@dataclass(frozen=True)
class Outcome:
    status: str  # completed | failed
    error_code: str | None
    sent: float  # the record's timestamp: when the planner's producer made it (epoch seconds)
    #: When the suite read it: when a client following the topic could know. Later than ``sent`` when the
    #: record waited in a producer's buffer while the broker was down.
    seen: float


@dataclass
class OutcomeLog:
    """Follows ``agent.outcomes`` from its beginning for the whole suite: each run's first outcome and
    when it was sent, so the suite knows when every run has finished and how soon runs complete after
    each fault. (The full check re-reads the topic afterwards; this is the live view.)"""

    bootstrap: str
    topic: str
    partitions: int
    codec: Codec
    auth: KafkaAuth = field(default_factory=KafkaAuth)
    first: dict[str, Outcome] = field(default_factory=dict)
    errors: int = 0

    async def follow(self, stop: asyncio.Event) -> None:
        consumer = AIOKafkaConsumer(**kafka_options(self.bootstrap, self.auth), enable_auto_commit=False,
                                    isolation_level="read_committed", fetch_max_wait_ms=200)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            while not stop.is_set():
                try:
                    batch = await consumer.getmany(timeout_ms=500)
                except Exception:  # the broker is being killed: keep following
                    self.errors += 1
                    await asyncio.sleep(RETRY_PAUSE_S)
                    continue
                seen = time.time()
                for messages in batch.values():
                    for msg in messages:
                        self._note(msg.value, msg.timestamp / 1000, seen)
        finally:
            await consumer.stop()

    def _note(self, value: bytes | None, sent: float, seen: float) -> None:
        try:
            event = self.codec.decode(value)
        except DecodeError:
            return
        if isinstance(event, (RunCompleted, RunFailed)) and event.run_id not in self.first:
            status = "completed" if isinstance(event, RunCompleted) else "failed"
            self.first[event.run_id] = Outcome(status, getattr(event, "error_code", None), sent, seen)
