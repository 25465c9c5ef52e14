"""AgentClient: submit tasks, wait for their outcome, read their history.

    async with AgentClient() as client:
        run_id = await client.submit("What is 17 * 23?", tools=["calculator"])
        result = await client.wait(run_id)

A bad task is refused by ``submit`` with ``TaskRejected`` and nothing is published; the rules are the
planner's own (streams/core/task_rules.py). ``wait`` reads the outcome from ``agent.outcomes``: the client
notes each partition's end offset *before* it looks at PostgreSQL, so an outcome published after that
look is still read from Kafka (no race, no polling).

Kafka is the intake: ``submit`` needs no database (tools are checked against the compacted
``agent.tools``), and ``wait`` for a run this client submitted needs none either. Calls that must read
PostgreSQL (history, status, a run submitted elsewhere) raise ``Unavailable`` while it is down, not the
driver's exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import TopicAuthorizationFailedError

from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.client import decisions, task_fields
from agentstream.streams.client.agents import AgentsClient
from agentstream.streams.client.outcomes import OutcomeWatcher, RunResult, parse_output
from agentstream.streams.client.sessions import SessionsClient
from agentstream.streams.client.task_fields import deadline_of, session_run_problem
from agentstream.streams.client.views import RecordedEvent, RunDetails, StepDetails, TokenEvent
from agentstream.streams.config.settings import Settings
from agentstream.streams.core import agents as agent_rules
from agentstream.streams.core import task_rules
from agentstream.streams.core import tool_calling as native_tool_calling
from agentstream.streams.core.approvals import Decision
from agentstream.streams.core.errors import (
    AgentRejected,
    DecodeError,
    TaskRejected,
    Unavailable,
)
from agentstream.streams.core.events import ApprovalDecided, RunCancelRequested, TaskSubmitted, TokenChunk
from agentstream.streams.core.ids import new_run_id
from agentstream.streams.core.kinds import TERMINAL_STATUSES
from agentstream.streams.core.outages import DATABASE, outage_of
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.runtime.headers import SESSION_HEADER
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.telemetry import trace_context as tracing

log = logging.getLogger(__name__)

MAX_TASK_BYTES = task_rules.MAX_TASK_BYTES
MAX_STEPS_LIMIT = task_rules.MAX_STEPS_LIMIT
MAX_METADATA = task_rules.MAX_METADATA


class AgentClient:
    """The client of a running agentstream: submit tasks, wait for their outcome or stream their tokens,
    approve, deny or cancel, and read a run's history and status.

    Use it as ``async with AgentClient() as client`` (or ``start()`` / ``close()``); settings come from
    the environment (``Settings.load()``) unless given. Kafka is the intake, so ``submit`` and ``wait``
    for a run this client submitted work without PostgreSQL; calls that read the history need it and
    raise ``Unavailable`` while it is down. A task the planner would refuse raises ``TaskRejected`` here,
    before anything is published.
    """

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.load()
        self.runtime = Runtime(self.settings, codec_for(self.settings))
        self.topics = self.runtime.topics
        self._pool: asyncpg.Pool | None = None
        self._catalog: ToolCatalog | None = None
        self._watcher: OutcomeWatcher | None = None
        self._futures: dict[str, asyncio.Future[RunResult]] = {}
        self._submitted: dict[str, datetime] = {}
        #: The pipeline's conversations: list, show, delete (streams/client/sessions.py).
        self.sessions = SessionsClient(self)
        #: The pipeline's agent definitions: register, list, show (streams/client/agents.py).
        self.agents = AgentsClient(self)

    async def __aenter__(self) -> AgentClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Connect. Raises ``TopicsMissing`` when the topics the client sends to and reads from do not
        exist yet (no worker has created them), rather than a timeout on the first send or wait."""
        from agentstream.streams.kafka.topic_admin import require_topics

        try:
            missing = await require_topics(self.settings.kafka_bootstrap, [  # sent to, waited on, streamed, tools
                self.topics.tasks, self.topics.outcomes, self.topics.tokens, self.topics.tools],
                optional=[self.topics.schemas], auth=self.settings.kafka_auth)
        except Exception:
            await self.runtime.producer.stop()  # built unstarted with the runtime: closed, not leaked
            raise
        await self.runtime.start()
        if self.topics.schemas not in missing:  # missing: the workers predate it, and cannot read it anyway
            try:  # before the first submit: workers of other versions read it
                await self.runtime.publish_schemas()
            except TopicAuthorizationFailedError:
                # A secure stack lets only the services publish schemas (streams/kafka/channels.py): this client
                # writes with schemas they know, and is upgraded after them (docs/upgrades.md).
                log.debug("not allowed to publish schemas to %s; writing with the services' schemas",
                          self.topics.schemas)

    async def close(self) -> None:
        if self._watcher is not None:
            await self._watcher.stop()
        if self._catalog is not None:
            await self._catalog.close()
        await self.agents.close()
        await self.runtime.stop()
        if self._pool is not None:
            await self._pool.close()

    async def pool(self) -> asyncpg.Pool:
        """The client's PostgreSQL pool (created on first use). Raises ``Unavailable`` when it cannot connect."""
        if self._pool is None:
            with _database():
                self._pool = await asyncpg.create_pool(self.settings.database_url, min_size=1, max_size=4)
        return self._pool

    # -- submit --------------------------------------------------------------------------------
    async def submit(self, task: str, *, tools: list[str] | None = None, max_steps: int | None = None,
                     deadline: datetime | timedelta | float | None = None, model: str | None = None,
                     system_prompt: str | None = None, metadata: dict[str, str] | None = None,
                     prefetch: bool = True, on_tool_error: str = "tell_model", run_id: str | None = None,
                     output_schema: str | Mapping[str, Any] | None = None, max_tokens: int | None = None,
                     temperature: float | None = None, top_p: float | None = None,
                     stop: Sequence[str] | None = None, seed: int | None = None, session: str | None = None,
                     tool_calling: str | None = None, agent: str | None = None) -> str:
        """Validate and publish a task; return its run id. Raises ``TaskRejected``.

        ``tools``: the tools the run may call (default: every registered tool). ``max_steps``: the most steps
        (default 8). ``deadline``: an absolute
        time, or a duration (timedelta or seconds) from now. ``prefetch``: start retrieval for the task
        text alongside the first model call. ``on_tool_error``: when a tool fails for good,
        ``tell_model`` (it decides) or ``fail_run``. ``run_id``: the run's id (default: a new one); a submit
        retried with the same id and task publishes the same event, so the run starts once however often
        the call is repeated (after a timeout, a lost connection).

        ``output_schema``: a JSON Schema (a dict, or JSON text) the answer must match; the run's
        ``RunResult.output`` is then the answer, parsed (docs/contract.md, "Structured output"). A schema
        that is not valid JSON Schema is refused here. ``max_tokens`` (per model step), ``temperature``,
        ``top_p``, ``stop`` and ``seed`` tune every model step; None: the pipeline's defaults
        (``AGENTSTREAM_MODEL_MAX_TOKENS``, 256 tokens; temperature 0; the engine's own top_p and seed).

        ``session``: make the task a turn of this conversation (a new one if the id is new): it starts from
        the session's transcript, and runs after the session's earlier turns (docs/contract.md,
        "Sessions"). Its run id is drawn on the session's partition; a ``run_id`` given with it must be
        there too (``Topics.run_id_for_session`` draws one).

        ``tool_calling``: ``native`` (the engine's own tool calling) or ``json`` (one JSON action per
        reply); None: the planner's default, ``AGENTSTREAM_TOOL_CALLING`` (``json``).

        ``agent``: run a registered agent (``agentstream agent register``): ``name``, its latest version when
        the planner admits the task, or ``name@version``. The run takes its tools, model, prompt, settings
        and limits from the definition; the task adds its text, deadline, metadata and session (any other
        field given is refused), and the run records the exact version (docs/agents.md). An unknown agent
        or version is refused here, naming those that exist.
        """
        at = deadline_of(deadline)
        if agent is not None:
            max_steps = await self._agent_steps(agent, max_steps, tools=tools, model=model,
                                                system_prompt=system_prompt, output_schema=output_schema,
                                                max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                                stop=list(stop or ()), seed=seed, tool_calling=tool_calling,
                                                prefetch=prefetch, on_tool_error=on_tool_error)
            tools = []
        max_steps = 8 if max_steps is None else max_steps
        tools = await self._check(task, tools, max_steps, at, model, system_prompt, metadata, on_tool_error,
                                  prefetch)
        schema_text = task_fields.schema_text(output_schema)
        if problem := task_rules.generation_problem(
                output_schema=schema_text, max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                stop=[] if stop is None else stop, seed=seed,
                max_tokens_limit=self.settings.generation.max_tokens_limit):
            raise TaskRejected(problem)
        if run_id is not None and (problem := task_rules.run_id_problem(run_id)):
            raise TaskRejected(problem)
        if problem := native_tool_calling.problem(tool_calling):
            raise TaskRejected(problem)
        if problem := task_rules.session_problem(session) or session_run_problem(self.topics, session, run_id):
            raise TaskRejected(problem)
        if session is not None and run_id is None:
            run_id = self.topics.run_id_for_session(session)
        await self.watch_outcomes()  # before publishing: the outcome cannot slip past us
        run_id = run_id or new_run_id()
        self._future(run_id)
        event = TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="client", task=task,
                                    tools=tools, max_steps=max_steps, deadline=at, model=model,
                                    system_prompt=system_prompt, metadata=dict(metadata or {}),
                                    prefetch=prefetch, on_tool_error=on_tool_error, output_schema=schema_text,
                                    max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                    stop=list(stop or ()), seed=seed, session=session, tool_calling=tool_calling,
                                    agent=agent)
        headers = [(tracing.HEADER, tracing.new_traceparent().encode())]
        if session is not None:  # the planner then handles the session's turns strictly in their order
            headers.append((SESSION_HEADER, session.encode()))
        future = await self.runtime.send(self.topics.tasks, event, headers=headers)
        await future
        self._submitted[run_id] = event.created_at
        return run_id

    async def _agent_steps(self, agent: str, max_steps: int | None, **fields: Any) -> int:
        """The ``max_steps`` a task naming ``agent`` carries (the definition's: the planner uses that one),
        once the reference resolves and the task sets nothing the definition decides; raises ``TaskRejected``."""
        problem = agent_rules.ref_problem(agent) or agent_rules.task_override_problem(
            agent, {**fields, "tools": fields["tools"] or []}, also=["max_steps"] if max_steps is not None else [])
        if problem:
            raise TaskRejected(problem)
        try:
            definition = await self.agents.show(agent)
        except AgentRejected as exc:
            raise TaskRejected(str(exc)) from None
        return definition.max_steps

    async def _check(self, task: Any, tools: Any, max_steps: Any, deadline: datetime | None, model: Any,
                     system_prompt: Any, metadata: Any, on_tool_error: Any, prefetch: Any) -> list[str]:
        """The task's tools (all registered ones when ``tools`` is None); raises ``TaskRejected``."""
        problem = task_rules.task_problem(
            task=task, tools=[] if tools is None else tools, max_steps=max_steps, deadline=deadline, model=model,
            system_prompt=system_prompt, metadata=metadata, on_tool_error=on_tool_error, prefetch=prefetch,
            now=datetime.now(UTC))
        if problem:
            raise TaskRejected(problem)
        catalog = await self._tool_catalog()
        if tools is None:
            return sorted(await catalog.all())
        unknown = await catalog.unknown(list(tools))
        if unknown:
            known = ", ".join(sorted(await catalog.all())) or "none (is a tool worker running?)"
            raise TaskRejected(f"unknown tool(s): {', '.join(unknown)}; registered tools: {known}")
        return list(dict.fromkeys(tools))

    async def cancel(self, run_id: str, reason: str = "") -> None:
        """Ask the planner to stop the run (it fails with error_code ``cancelled``; a generation in
        progress is aborted). Cancelling a run that has ended does nothing."""
        event = RunCancelRequested.build(run_id=run_id, step=f"{run_id}:cancel", service="client",
                                         reason=reason, requested_by="client")
        await (await self.runtime.send(self.topics.tasks, event))

    async def approve(self, run_id: str, step_id: str, reason: str = "", by: str = "", *,
                      record_by: bool = False) -> Decision:
        """Let the tool call waiting at ``step_id`` run. Returns the decision that holds (``Decision``:
        an earlier denial stands over this approval). ``record_by``: see ``_decide``."""
        return await self._decide(run_id, step_id, True, reason, by, record_by)

    async def deny(self, run_id: str, step_id: str, reason: str = "", by: str = "", *,
                   record_by: bool = False) -> Decision:
        """Refuse the tool call waiting at ``step_id``; the model is told, with the reason. Returns the
        decision that holds (``Decision``: an earlier approval stands over this denial)."""
        return await self._decide(run_id, step_id, False, reason, by, record_by)

    async def _decide(self, run_id: str, step_id: str, asked: bool, reason: str, by: str,
                      record_by: bool = False) -> Decision:
        """With ``approvals = recorded`` the decision is first recorded under this client's own database
        login (``agentstream_decide``: who decided is the login, ``by`` is ignored; the first decision on a
        step stands; a step the run does not wait at is refused), then the decision that stands is
        announced; the planner acts on the record. With ``open``, announced only. ``record_by`` (the HTTP
        gateway, for its token ``by``, ``gateway:<tenant>:<token>``): recorded as ``by`` where the login is
        the gateway's (``agentstream_decide_as``, migration 0021), else under the login as above."""
        decision = Decision(run_id=run_id, step_id=step_id, asked=asked, approved=asked, reason=reason,
                            decided_by=by or "client", decided_at=None, recorded=False)
        if self.settings.approvals == "recorded":
            decision = await self._record(decision, as_by=record_by and bool(by))
        event = ApprovalDecided.build(run_id=run_id, step=step_id, service="client", approved=decision.approved,
                                      reason=decision.reason, decided_by=decision.decided_by)
        await (await self.runtime.send(self.topics.tasks, event))
        return decision

    async def _record(self, asked: Decision, *, as_by: bool = False) -> Decision:
        """The decision recorded on the step, by this call or an earlier one (streams/client/decisions.py)."""
        login = urlsplit(self.settings.database_url).username or "?"
        with _database():
            return await decisions.record(await self.pool(), asked, login, as_by=as_by)

    async def awaiting_approval(self) -> list[dict[str, Any]]:
        """Tool calls waiting for a person's approval: run id, step id, tool, arguments, since when (a run
        whose parallel calls fan out may have several: streams/client/decisions.py)."""
        with _database():
            return await decisions.awaiting(await self.pool())

    async def _tool_catalog(self) -> ToolCatalog:
        """Tool names are checked against ``agent.tools``, not PostgreSQL: submit works while the
        database is down (streams/catalog/tools.py)."""
        if self._catalog is None:
            self._catalog = ToolCatalog.for_runtime(self.runtime)
        return self._catalog

    # -- wait ----------------------------------------------------------------------------------
    async def watch_outcomes(self) -> None:
        """Start following ``agent.outcomes`` now (``submit`` and ``wait`` do it on first use); a caller
        about to submit many runs at once calls it first, so no outcome can slip past a waiter."""
        if self._watcher is None:
            self._watcher = OutcomeWatcher(self.settings.kafka_bootstrap, self.topics.outcomes,
                                           self.settings.partitions, self.runtime.codec, self._resolve,
                                           request_timeout_ms=self.settings.kafka_request_timeout_ms,
                                           auth=self.settings.kafka_auth)
            await self._watcher.start()

    def forget(self, run_id: str) -> None:
        """Stop following ``run_id``'s outcome for a ``wait`` to come (``submit`` follows every run it
        publishes). For a long-lived client that submits for others and never waits (the HTTP gateway):
        without it, each run it submitted would be remembered for as long as the client lives."""
        self._futures.pop(run_id, None)
        self._submitted.pop(run_id, None)

    def _future(self, run_id: str) -> asyncio.Future[RunResult]:
        if run_id not in self._futures:
            self._futures[run_id] = asyncio.get_running_loop().create_future()
        return self._futures[run_id]

    def _resolve(self, result: RunResult) -> None:
        future = self._futures.get(result.run_id)
        if future is not None and not future.done():  # only runs someone submitted or waits for
            future.set_result(result)

    async def wait(self, run_id: str, timeout: float | None = None) -> RunResult:
        """The run's outcome, once it has one. Raises ``TimeoutError`` after ``timeout`` seconds, and
        ``Unavailable`` when it must ask PostgreSQL (a run this client did not submit) and cannot."""
        await self.watch_outcomes()
        followed = run_id in self._futures  # submitted here: the watcher started before the task was sent
        future = self._future(run_id)
        # A run this client submitted cannot have ended unseen: its outcome is in the future already or
        # still to come. Another run may have ended before the watcher started: PostgreSQL knows.
        if not future.done() and not followed:
            try:
                with _database():
                    row = await (await self.pool()).fetchrow(
                        """SELECT status, answer, error_code, error, step_count, state->>'output' AS output,
                                  extract(epoch FROM (updated_at - submitted_at)) * 1000 AS ms
                           FROM runs WHERE run_id = $1""", run_id)
            except Unavailable:
                self._futures.pop(run_id, None)
                raise
            if row is not None and row["status"] in TERMINAL_STATUSES:
                return RunResult(run_id, row["status"], row["answer"], row["error_code"], row["error"],
                                 row["step_count"], float(row["ms"]), parse_output(row["output"]))
        result = await asyncio.wait_for(asyncio.shield(future), timeout)
        self._futures.pop(run_id, None)
        return result

    # -- tokens --------------------------------------------------------------------------------
    async def stream(self, run_id: str, *, from_offset: int | None = None,
                     poll_ms: int = 100) -> AsyncIterator[TokenEvent]:
        """The run's generated text as it is made, until the run ends.

        Each item carries its offset in ``agent.tokens``: after a disconnect, call again with
        ``from_offset=last.offset + 1`` to continue with nothing lost and nothing repeated. Without
        ``from_offset`` the stream starts at the run's submission (found by timestamp, so no scan).
        """
        tp = TopicPartition(self.topics.tokens, self.topics.partition_for(run_id))
        await self.watch_outcomes()
        outcome = self._future(run_id)
        consumer = AIOKafkaConsumer(**self.settings.kafka_options(), enable_auto_commit=False,
                                    isolation_level="read_committed", fetch_max_wait_ms=poll_ms)
        await consumer.start()
        try:
            consumer.assign([tp])
            if from_offset is None:
                from_offset = await self._first_offset(consumer, tp, run_id)
            consumer.seek(tp, from_offset)
            finished = await self._finished(run_id)  # ended before we looked: its outcome is not awaited
            seen: set[tuple[str, int]] = set()
            end: int | None = None
            while True:
                batch = await consumer.getmany(tp, timeout_ms=poll_ms)
                for msg in batch.get(tp, []):
                    if msg.key != run_id.encode():
                        continue
                    try:
                        chunk = await self.runtime.codec.decode_async(msg.value)
                    except DecodeError:
                        continue
                    if isinstance(chunk, TokenChunk) and (chunk.step_id, chunk.seq) not in seen:
                        seen.add((chunk.step_id, chunk.seq))  # a regenerated step repeats its chunks
                        yield TokenEvent(offset=msg.offset, step_id=chunk.step_id, seq=chunk.seq, text=chunk.text)
                if end is None and (finished or outcome.done()):
                    # Every token of the run was acknowledged before its outcome was published.
                    end = (await consumer.end_offsets([tp]))[tp]
                if end is not None and await consumer.position(tp) >= end:
                    return
        finally:
            await consumer.stop()

    async def _first_offset(self, consumer: AIOKafkaConsumer, tp: TopicPartition, run_id: str) -> int:
        # The end offset is read first: a chunk produced while the timestamp is looked up lies past it,
        # so falling back to it can never skip the run's first tokens.
        end = (await consumer.end_offsets([tp]))[tp]
        submitted = self._submitted.get(run_id)
        if submitted is None:
            with _database():
                submitted = await (await self.pool()).fetchval("SELECT submitted_at FROM runs WHERE run_id = $1",
                                                               run_id)
        if submitted is None:
            return end
        found = (await consumer.offsets_for_times({tp: int(submitted.timestamp() * 1000) - 1000})).get(tp)
        return end if found is None else found.offset

    async def _finished(self, run_id: str) -> bool:
        try:
            with _database():
                status = await (await self.pool()).fetchval("SELECT status FROM runs WHERE run_id = $1", run_id)
        except Unavailable:
            if run_id not in self._submitted:
                raise
            return False  # submitted here: its outcome reaches the watcher, which follows it since then
        return status in TERMINAL_STATUSES

    # -- history -------------------------------------------------------------------------------
    async def status(self, run_id: str) -> RunDetails | None:
        """The run's row and its steps, from PostgreSQL (None for an unknown run)."""
        pool = await self.pool()
        with _database():
            run = await pool.fetchrow(
                """SELECT run_id, status, task, step_count, answer, error_code, error, submitted_at, updated_at,
                          finished_at FROM runs WHERE run_id = $1""", run_id)
            if run is None:
                return None
            steps = await pool.fetch(
                """SELECT step_index, kind, status, request::text AS request, result::text AS result, error,
                          requested_at, completed_at FROM steps WHERE run_id = $1 ORDER BY step_index""", run_id)
        return RunDetails(
            run_id=run["run_id"], status=run["status"], task=run["task"], step_count=run["step_count"],
            answer=run["answer"], error_code=run["error_code"], error=run["error"],
            submitted_at=run["submitted_at"], updated_at=run["updated_at"], finished_at=run["finished_at"],
            steps=[StepDetails(step_index=s["step_index"], kind=s["kind"], status=s["status"],
                               request=json.loads(s["request"]),
                               result=json.loads(s["result"]) if s["result"] else None, error=s["error"],
                               requested_at=s["requested_at"], completed_at=s["completed_at"]) for s in steps])

    async def events(self, run_id: str) -> list[RecordedEvent]:
        """Every recorded event of the run, in the order they were produced."""
        with _database():
            rows = await (await self.pool()).fetch(
                """SELECT event_id::text, step_id, event_type, topic, partition, "offset", produced_at,
                          appended_at, consumed_at, consumed_by, producer, payload::text AS payload
                   FROM events WHERE run_id = $1 ORDER BY produced_at, recorded_at""", run_id)
        return [RecordedEvent(event_id=r["event_id"], step_id=r["step_id"], event_type=r["event_type"],
                              topic=r["topic"], partition=r["partition"], offset=r["offset"],
                              produced_at=r["produced_at"], appended_at=r["appended_at"],
                              consumed_at=r["consumed_at"], consumed_by=r["consumed_by"], producer=r["producer"],
                              payload=json.loads(r["payload"])) for r in rows]


@contextlib.contextmanager
def _database() -> Iterator[None]:
    """PostgreSQL being down is ``Unavailable`` to the client's caller, not the driver's exception."""
    try:
        yield
    except Exception as exc:
        if outage_of(exc) == DATABASE:
            raise Unavailable(f"PostgreSQL is unavailable ({type(exc).__name__}: {exc}); try again later") from exc
        raise
