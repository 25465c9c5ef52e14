"""Re-execute recorded runs through the same pipeline code, isolated from production.

A ``ReplaySession`` is a pipeline of its own: topics under a fresh prefix (``replay.<id>.``, created from
the catalogue, deleted at the end unless kept), consumer groups under it, and in-process workers:

- the real planner (``agentstream.services.planner``) — the code under test;
- ``recorded``: the responder (``services/replay/responder.py``) answers every model, tool and retrieval
  request from the original run's record: deterministic, no model, no tool side effects;
- ``fork``: the responder answers steps before N from the record and hands steps from N on to the
  real inference, tool and retrieval handlers;
- ``live``: the real inference (``--backend`` / ``--model``), tool and retrieval services recompute
  everything (tools run again, with their side effects).

The new run has a new run id and ``TaskSubmitted.replay_of`` = the original (``runs.replay_of``). The
session's planner only adopts runs of its own topic prefix from PostgreSQL (the database is shared
with production: no planner may pick up, or time out, another pipeline's run). Approvals the original run got
are given again, from its recorded ``ApprovalDecided`` events; a call with no recorded decision is
denied. After the run ends its decisions are compared with the original's (streams/replay/diff.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from agentstream.services.replay.responder import LiveHandlers, Recording, Responder, parse_step
from agentstream.services.worker import SERVICES, Worker, WorkerOptions, make_backend
from agentstream.streams.catalog.agents import copy_agents
from agentstream.streams.catalog.tools import copy_catalogue
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.client.outcomes import RunResult
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import ReplayError
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.replay import timeline
from agentstream.streams.replay.diff import RunDiff, WindowReport, diff_runs, window_report
from agentstream.streams.replay.records import Timeline, ms
from agentstream.streams.runtime.headers import SESSION_HEADER
from agentstream.streams.telemetry import trace_context as tracing

log = logging.getLogger(__name__)
MODES = ("recorded", "live", "fork")


@dataclass(frozen=True)
class Overrides:
    """What the rerun changes about the task (None: as the original)."""

    model: str | None = None
    system_prompt: str | None = None
    tools: Sequence[str] | None = None


@dataclass
class Rerun:
    original: dict[str, Any]  # Timeline.summary() of the original
    rerun: dict[str, Any]  # and of the new run
    result: RunResult
    mode: str
    from_step: int | None
    original_ms: float
    diff: RunDiff

    @property
    def run_id(self) -> str:
        return self.result.run_id

    @property
    def finished(self) -> bool:
        return self.result.status in ("completed", "failed")

    @property
    def same_decisions(self) -> bool:
        return not self.diff.decisions_changed

    @property
    def speedup(self) -> float:
        return self.original_ms / self.result.duration_ms if self.result.duration_ms > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        return {"original": self.original["run_id"], "run_id": self.run_id, "mode": self.mode,
                "from_step": self.from_step, "status": self.result.status, "answer": self.result.answer,
                "error_code": self.result.error_code, "original_ms": round(self.original_ms, 2),
                "duration_ms": round(self.result.duration_ms, 2), "speedup": round(self.speedup, 2),
                "same_decisions": self.same_decisions, "diff": self.diff.to_dict()}


class ReplaySession:
    """One isolated pipeline for replays of one mode. Use as ``async with ReplaySession(...) as s``."""

    def __init__(self, settings: Settings, mode: str = "recorded", options: WorkerOptions | None = None, *,
                 prefix: str | None = None, partitions: int = 1, keep_topics: bool = False,
                 join_timeout: float = 60.0) -> None:
        if mode not in MODES:
            raise ReplayError(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
        self.mode = mode
        self.options = options or WorkerOptions(backend="scripted")
        self.settings = replace(settings, topic_prefix=prefix or f"replay.{uuid.uuid4().hex[:8]}.",
                                partitions=partitions)
        self.keep_topics = keep_topics
        self.join_timeout = join_timeout
        self.worker: Worker | None = None
        self.responder: Responder | None = None
        self.client: AgentClient | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closers: list[Any] = []
        self._catalogues: set[str] = set()  # topic prefixes whose tool catalogue was copied here

    @property
    def prefix(self) -> str:
        return self.settings.topic_prefix

    async def __aenter__(self) -> ReplaySession:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _start(self) -> None:
        await create_topics(self.settings)
        services = SERVICES if self.mode == "live" else ("planner",)
        self.worker = worker = Worker(services, self.settings, self.options)
        await worker.start()  # topics (from the catalogue, under the prefix), migrations, services ready
        if self.mode != "live":
            live = await self._live_handlers(worker) if self.mode == "fork" else None
            self.responder = Responder(worker.runtime, live, worker.pool)
            s = self.settings
            worker.runners.extend(self.responder.services(
                session_timeout_ms=s.session_timeout_ms, heartbeat_interval_ms=max(100, s.session_timeout_ms // 10),
                fetch_max_wait_ms=s.fetch_max_wait_ms,
                **self.options.service_overrides))
        self._task = asyncio.create_task(worker.run(self._stop))
        joined = asyncio.create_task(worker.wait_joined(self.join_timeout))
        done, _ = await asyncio.wait([joined, self._task], return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:
            joined.cancel()
            self._task.result()
        await joined
        self.client = AgentClient(self.settings)
        await self.client.start()
        await self.client.watch_outcomes()  # before any run is submitted: concurrent waits race-free
        # Both producers learn every topic's leader now, not on the first replay's critical path.
        names = [spec.name for spec in worker.runtime.topics.specs()]
        await asyncio.gather(*(rt.producer.partitions_for(n) for rt in (worker.runtime, self.client.runtime)
                               for n in names))
        # And the planner's tool catalogue is loaded, and its writer connections plan the history function
        # now (an empty batch writes nothing).
        assert worker.planner is not None  # every mode runs a planner
        await worker.planner.tools.refresh()
        writer = worker.planner.store.writer
        await asyncio.gather(*(writer.fetchval("SELECT agentstream_record_transitions($1::jsonb)", "{}")
                               for _ in range(writer.get_max_size())))

    async def _live_handlers(self, worker: Worker) -> LiveHandlers:
        """The real services' handlers, for the steps a fork computes live (they publish on the
        session's topics through the responder's context)."""
        from agentstream.services.inference.service import InferenceService
        from agentstream.services.retrieval.service import RetrievalService

        assert worker.pool is not None
        backend = make_backend(self.options.backend, **self.options.backend_options)
        await backend.start()
        self._closers.append(backend.close)
        tools = await worker.tool_service()  # closed with the worker (its pools are the worker's)
        self._closers.append(tools.close)
        retrieval = RetrievalService(worker.runtime, worker.pool)
        await retrieval.start()
        return LiveHandlers(inference=InferenceService(worker.runtime, backend), tools=tools, retrieval=retrieval)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:  # its failure, if any, was raised by _start; clean up regardless
            for outcome in await asyncio.gather(self._task, return_exceptions=True):
                if isinstance(outcome, Exception):
                    log.warning("replay session %s stopped with %r", self.prefix, outcome)
        if self.client is not None:
            await self.client.close()
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                await close()
        if self.worker is not None:
            await self.worker.close()
        if not self.keep_topics and self.worker is not None:
            await delete_topics(self.settings)

    # -- replaying -----------------------------------------------------------------------------
    async def replay(self, original: str, *, overrides: Overrides | None = None, from_step: int | None = None,
                     timeout: float = 300.0) -> Rerun:
        """Publish a new run of ``original``'s task, wait for its outcome and compare its decisions."""
        run_id, recording, orig = await self.submit(original, overrides=overrides, from_step=from_step)
        return await self.finish(run_id, orig, recording, from_step=from_step, timeout=timeout)

    async def submit(self, original: str, *, overrides: Overrides | None = None,
                     from_step: int | None = None) -> tuple[str, Recording, Timeline]:
        assert self.worker is not None and self.worker.pool is not None and self.client is not None
        if (from_step is not None) != (self.mode == "fork"):
            raise ReplayError("from_step is for fork sessions, and fork sessions need it")
        pool = self.worker.pool
        async with pool.acquire() as conn:
            orig = await timeline.load(conn, original)
        if orig is None:
            raise ReplayError(f"no run {original}")
        if orig.run["status"] not in ("completed", "failed"):
            raise ReplayError(f"run {original} has not finished (it is {orig.run['status']}); replay it once it has")
        recording = await Recording.load(pool, original)
        await self._copy_tools(original)
        session = orig.task.get("session")  # a turn of a session: its run id on the session's partition
        run_id = Topics.of(self.settings).run_id_for_session(session) if session else new_run_id()
        event = self._task_event(run_id, orig, overrides or Overrides())
        agent = await pool.fetchval(  # the agent the run started with (it may have handed over since)
            "SELECT coalesce(state->>'handed_from', state->>'agent') FROM runs WHERE run_id = $1", original)
        if agent is not None:  # the exact definition the original ran (a later version must not change it)
            if overrides is not None and overrides != Overrides():
                raise ReplayError(f"run {original} ran agent {agent}: its model, prompt and tools are the "
                                  "definition's; register a new version to try others")
            event = replace(event, agent=agent)
        if self.responder is not None:
            self.responder.expect(event.run_id, recording, live_from=from_step)
        headers = [(tracing.HEADER, tracing.new_traceparent().encode())]
        if session:
            headers.append((SESSION_HEADER, session.encode()))
        await (await self.client.runtime.send(self.client.topics.tasks, event, headers=headers))
        return event.run_id, recording, orig

    async def _copy_tools(self, original: str) -> None:
        """Recorded and fork sessions serve no tools of their own, and their topics (``agent.tools``
        among them) have a prefix of their own: their planner checks the replayed task's tool names
        against a copy of the catalogue of the pipeline that ran the original (made once per pipeline).
        Every session, live too, gets a copy of its agent catalogue: a run that named an agent replays
        with the exact definition it ran."""
        assert self.worker is not None and self.worker.pool is not None
        prefix = await self.worker.pool.fetchval(
            "SELECT coalesce(state->>'topic_prefix', '') FROM runs WHERE run_id = $1", original)
        if prefix not in self._catalogues:
            if self.mode != "live":
                await copy_catalogue(Topics(prefix).tools, self.worker.runtime)
            await copy_agents(Topics(prefix).agents, self.worker.runtime)
            self._catalogues.add(prefix)

    async def finish(self, run_id: str, orig: Timeline, recording: Recording, *,
                     from_step: int | None = None, timeout: float = 300.0) -> Rerun:
        assert self.client is not None and self.worker is not None and self.worker.pool is not None
        approver = asyncio.create_task(self._approve(run_id, recording))
        try:
            result = await self.client.wait(run_id, timeout=timeout)
        except TimeoutError as exc:
            raise ReplayError(f"the rerun {run_id} of {orig.run['run_id']} did not end within {timeout:g} s") from exc
        finally:
            approver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await approver
        async with self.worker.pool.acquire() as conn:
            new = await timeline.load(conn, run_id)
        assert new is not None
        original_ms = ms(orig.start, orig.end) or 0.0
        return Rerun(original=orig.summary(), rerun=new.summary(), result=result, mode=self.mode,
                     from_step=from_step, original_ms=original_ms, diff=diff_runs(orig.summary(), new.summary()))

    def _task_event(self, run_id: str, orig: Timeline, o: Overrides) -> TaskSubmitted:
        """The original TaskSubmitted (from its recorded payload), with the overrides and ``replay_of``.
        A deadline keeps its distance from submission. A turn of a session keeps its session: the planner
        begins it from the transcript recorded with the original (services/planner/sessions.py)."""
        task = orig.task
        deadline = None
        if task.get("deadline"):
            budget = datetime.fromisoformat(task["deadline"]) - orig.start
            deadline = datetime.now(UTC) + budget
        metadata = {**{str(k): str(v) for k, v in (task.get("metadata") or {}).items()}, "replay_mode": self.mode}
        return TaskSubmitted.build(
            run_id=run_id, step=f"{run_id}:task", service="replay", task=task.get("task", orig.run["task"]),
            tools=list(o.tools) if o.tools is not None else list(task.get("tools") or []),
            max_steps=int(task.get("max_steps") or max(1, orig.run["step_count"])), deadline=deadline,
            model=o.model if o.model is not None else task.get("model"),
            system_prompt=o.system_prompt if o.system_prompt is not None else task.get("system_prompt"),
            metadata=metadata, prefetch=bool(task.get("prefetch", True)),
            on_tool_error=task.get("on_tool_error") or "tell_model", replay_of=orig.run["run_id"],
            output_schema=task.get("output_schema"), max_tokens=task.get("max_tokens"),
            temperature=task.get("temperature"), top_p=task.get("top_p"), stop=list(task.get("stop") or []),
            seed=task.get("seed"), session=task.get("session"))

    async def _approve(self, run_id: str, recording: Recording, every_s: float = 0.05) -> None:
        """Give the replayed run the approvals the original got (deny what has no recorded decision)."""
        assert self.client is not None and self.worker is not None and self.worker.pool is not None
        decided: set[str] = set()
        while True:
            await asyncio.sleep(every_s)
            # The run's pending call, or the calls of its fan-out that wait (several tool calls of one reply).
            steps = await self.worker.pool.fetchval(
                """SELECT CASE WHEN state->>'pending_kind' = 'tools'
                               THEN jsonb_path_query_array(state->'pending_request',
                                                           '$.calls[*] ? (@.awaiting_approval == true).step_id')
                               WHEN status = 'awaiting_approval' THEN jsonb_build_array(state->'pending_step_id')
                          END::text
                   FROM runs WHERE run_id = $1 AND status IN ('running', 'awaiting_approval')""", run_id)
            for step in json.loads(steps or "[]"):
                if step in decided:
                    continue
                decided.add(step)
                index, _ = parse_step(run_id, step)
                approved, reason, by = recording.approvals.get(index, (False, "replay: no recorded decision",
                                                                       "replay"))
                decide = self.client.approve if approved else self.client.deny
                await decide(run_id, step, reason=reason, by=f"replay ({by})")


async def create_topics(settings: Settings, *, within_s: float = 15.0) -> None:
    """Create the catalogue's topics under the prefix and wait until every partition has a leader,
    so the session's consumers do not start on partitions the broker is still electing for."""
    topics = Topics.of(settings)
    specs = topics.specs()
    await ensure_topics(settings.kafka_bootstrap, specs, auth=settings.kafka_auth)
    admin = AIOKafkaAdminClient(**settings.kafka_options())
    await admin.start()
    try:
        deadline = asyncio.get_running_loop().time() + within_s
        while asyncio.get_running_loop().time() < deadline:
            described = await admin.describe_topics([s.name for s in specs])
            if all(d["error_code"] == 0 and len(d["partitions"]) > 0
                   and all(p["error_code"] == 0 and p["leader"] >= 0 for p in d["partitions"]) for d in described):
                return
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


async def delete_topics(settings: Settings) -> None:
    """Delete the replay's topics (never unprefixed ones); leftovers are clutter, not a failed replay."""
    try:
        await Topics(settings.topic_prefix, settings.partitions).delete_all(settings.kafka_bootstrap, auth=settings.kafka_auth)
    except Exception as exc:
        log.warning("could not delete replay topics under %s: %s", settings.topic_prefix, exc)


async def rerun(settings: Settings, run_id: str, *, mode: str = "recorded", from_step: int | None = None,
                overrides: Overrides | None = None, options: WorkerOptions | None = None,
                keep_topics: bool = False, timeout: float = 300.0) -> Rerun:
    """One replay (``mode`` recorded or live) or fork (``from_step``) in a session of its own."""
    if from_step is not None:
        mode = "fork"
    async with ReplaySession(settings, mode, options, keep_topics=keep_topics) as session:
        return await session.replay(run_id, overrides=overrides, from_step=from_step, timeout=timeout)


@dataclass
class WindowResult:
    originals: list[str]
    reruns: list[Rerun] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)

    def report(self) -> WindowReport:
        return window_report([(r.original, r.rerun) for r in self.reruns])


async def window(settings: Settings, since: datetime, until: datetime, *, mode: str = "live",
                 overrides: Overrides | None = None, options: WorkerOptions | None = None, limit: int = 100,
                 concurrency: int = 8, keep_topics: bool = False, timeout: float = 300.0) -> WindowResult:
    """Re-run every finished task submitted in [since, until) that is not itself a replay, in one
    session, ``concurrency`` at a time, and collect the comparisons."""
    from agentstream.streams.store import db

    conn = await db.connect(settings.database_url)
    try:
        ids = [r["run_id"] for r in await conn.fetch(
            """SELECT run_id FROM runs WHERE submitted_at >= $1 AND submitted_at < $2 AND replay_of IS NULL
               AND status IN ('completed', 'failed') ORDER BY submitted_at LIMIT $3""", since, until, limit)]
    finally:
        await conn.close()
    out = WindowResult(originals=ids)
    if not ids:
        return out
    gate = asyncio.Semaphore(concurrency)
    async with ReplaySession(settings, mode, options, keep_topics=keep_topics) as session:
        async def one(original: str) -> None:
            async with gate:
                try:
                    out.reruns.append(await session.replay(original, overrides=overrides, timeout=timeout))
                except (ReplayError, TimeoutError) as exc:
                    out.errors[original] = str(exc)

        await asyncio.gather(*(one(r) for r in ids))
    out.reruns.sort(key=lambda r: ids.index(r.original["run_id"]))
    return out
