"""The tool service: ToolCallRequested in, ToolCallCompleted out; a step's tool runs at most once, and
only if its run asked for it.

Anyone who can reach the broker can publish a request, so none is taken on trust: the same statement
that claims a call checks it against its run's record in PostgreSQL (the run exists and is not over, the
tool is one of its tools, the step is its pending tool call with these arguments, approved when the tool
needs approval: streams/store/tool_calls.py). A refused call is not run; it goes to the dead-letter topic with
the reason (error kind ``refused``) and produces no result the planner could apply — except when the run
asked for exactly this call and only this worker's stricter definition of the tool (it needs approval)
stands in the way: then the run gets that as the step's error result.

Before a tool runs, a row keyed by the step id is inserted in ``tool_calls`` (status ``running``); when
it finishes the row gets the result. A redelivered request (a planner republishing after a crash, a
rebalance) finds the row: a finished call is answered from it (``replayed=true``) without running the
tool again; a call still marked ``running`` was interrupted mid-execution (its worker died), and
because its effects may or may not have happened, it is not run again either: the result says so.

A tool that says running it twice is harmless (``idempotent=True``: the calculator, ``sql_query``,
``retrieve``, ``http_get``) is checked against its run the same way, in the same statement, but keeps no
row: no claim before it runs and no result after, two PostgreSQL commits a call fewer. A redelivered or
interrupted call of it runs again (the planner applies one answer per step and drops copies), and a copy
that arrives after its run has moved on is recognised from the run's recorded step (same tool and
arguments, done) and dropped, where a call with no such step is refused as a forgery.

Retries happen here, inside the claimed call, not in the runtime: a retriable tool error (or a
timeout, for tools that say timeouts are retriable) runs the tool again after an exponential backoff,
up to the tool's ``max_attempts``, and the row's ``attempts`` counts the executions started. The
runtime must not retry a handler that already ran a tool: its second try would find the row
``running`` and answer "interrupted". When the attempts are used up, the step fails ("failed after N
attempts: …") and the request goes to the dead-letter topic with error kind ``retries_exhausted``;
the handler itself returns normally, so the runtime does not dead-letter the record a second time.

A tool that fails because this worker's PostgreSQL is down (its own writes through ``ctx.pool`` fail
with an outage error and the database does not answer a probe) did not take effect there: its
transaction was never committed. The handler then raises the outage, so the runtime waits it out
(partition paused, ``/readyz`` saying why) and calls the handler again, which finds its own row
``running`` and, remembered in memory, runs the tool again as the next attempt instead of answering
"interrupted". The same memory covers a database failure between two retries. Only a worker that
dies during the outage leaves the row ``running``: its successor answers "interrupted", as for any
call whose effects are unknown.

Instrumentation (when the worker has metrics / tracing): calls by tool and outcome, their duration,
and a ``tool NAME`` span around the execution (all its attempts) inside the step's span.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.services.tools.registry import Tool, ToolContext
from agentstream.streams.core.errors import DecodeError, ToolArgumentError, ToolError
from agentstream.streams.core.events import (
    Event,
    RetrievalCompleted,
    RetrievalRequested,
    ToolCallCompleted,
    ToolCallRequested,
)
from agentstream.streams.core.outages import DATABASE, outage_of
from agentstream.streams.runtime.dead_letters import Rejected, publish_dead_letter, refuse
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner
from agentstream.streams.store import tool_calls
from agentstream.streams.store.history import pg_text, to_json
from agentstream.streams.store.tool_calls import EarlierCall, Verdict
from agentstream.streams.telemetry import stages

log = logging.getLogger(__name__)
SERVICE = "tools"
RETRIES_EXHAUSTED = "retries_exhausted"
#: A call its run did not ask for, or may not have yet (streams/store/tool_calls.py): an error result's kind
#: when the run asked for it, else the dead letter's.
REFUSED = "refused"


@dataclass(frozen=True)
class Outcome:
    """How a claimed call ended: a JSON result, or an error with its kind, after ``attempts`` runs."""

    attempts: int
    result: str | None = None
    error: str | None = None
    #: unknown_tool | invalid_arguments | timeout | tool_error | retries_exhausted | interrupted | refused
    error_kind: str | None = None


class ToolService:
    def __init__(self, runtime: Runtime, pool: asyncpg.Pool, tools: list[Tool], *,
                 query_pool: asyncpg.Pool | None = None) -> None:
        self.runtime = runtime
        self.pool = pool
        #: Handed to the tools as ``ToolContext.query_pool`` (``sql_query`` runs on it, never on ``pool``).
        self.query_pool = query_pool
        self.tools = {t.name: t for t in tools}
        self.retrievals = RetrievalWaiter(runtime)
        self._unrecorded: dict[str, Outcome] = {}
        #: Claimed calls whose last attempt (the value) was stopped by a database outage, without effect
        #: there: the runtime's next try of the handler runs the tool again instead of "interrupted".
        self._stopped: dict[str, int] = {}
        self._metrics = metrics = getattr(runtime, "metrics", None)  # None: off (or a stand-in runtime in tests)
        self._tracing = getattr(runtime, "tracing", None)
        self._step_seconds = metrics.step_seconds.labels("tool") if metrics else None
        self._children: dict[tuple[str, str], tuple[Any, Any]] = {}

    def service(self, *, concurrency: int = 32, **overrides) -> ServiceRunner:
        topics = self.runtime.topics
        config = ServiceConfig(name=SERVICE, topics=[topics.tool_requests], group_id=topics.group(SERVICE),
                               concurrency=concurrency, **overrides)
        return _ToolRunner(self, config)

    async def close(self) -> None:
        await self.retrievals.stop()

    async def handle(self, event: Event, ctx: Context) -> None:
        if not isinstance(event, ToolCallRequested):
            raise TypeError(f"the tool service does not handle {type(event).__name__}")
        started = time.perf_counter()
        tool = self.tools.get(event.tool)
        problem: Outcome | None = None  # an error answer that needs no execution
        arguments: dict[str, Any] = {}
        try:
            parsed = json.loads(event.arguments)
            arguments_json: str | None = to_json(parsed)
        except json.JSONDecodeError as exc:
            arguments_json = None
            problem = Outcome(0, error=f"invalid arguments: {exc}", error_kind="invalid_arguments")
        if tool is None:
            problem = Outcome(0, error=f"unknown tool {event.tool!r}; this worker serves "
                                       f"{', '.join(sorted(self.tools)) or 'none'}", error_kind="unknown_tool")
        elif problem is None:
            try:
                arguments = tool.validate(parsed)
            except ToolArgumentError as exc:
                problem = Outcome(0, error=f"invalid arguments: {exc}", error_kind="invalid_arguments")
        clock = stages.clock()
        claiming = time.perf_counter()
        # The run's record decides first, even for a call answered with an error: any answer is one the
        # planner may apply, and only a call its run asked for may have one (streams/store/tool_calls.py). An
        # idempotent tool's call is checked the same way but not claimed: it leaves no row.
        recorded = tool is None or not tool.idempotent
        verdict = await tool_calls.claim(self.pool, event, arguments_json, prefix=self.runtime.topics.prefix,
                                         requires_approval=tool is not None and tool.requires_approval,
                                         execute=problem is None and recorded)
        if clock is not None:
            clock.since("tools.claim", claiming)
        if verdict.refusal is not None:
            # A copy of an answered call, or a call its run really asked for but ended (deadline, cancel)
            # before it ran: stale, not forged; nothing to run, answer or dead-letter.
            ended = verdict.refusal == "run_finished"
            if ((ended or (not recorded and verdict.refusal in tool_calls.MOVED_ON))
                    and await tool_calls.answered(self.pool, event, arguments_json, or_requested=ended)):
                log.info("tools: %s was answered before, or its run ended before it ran; dropping it",
                         event.step_id)
                return
            await self._refuse(ctx, event, started, verdict)
            return
        if problem is not None:
            await self._reply(ctx, event, started, problem)
            return
        assert tool is not None  # (no tool is a problem)
        previous = verdict.earlier
        unrecorded = self._unrecorded.get(event.step_id)
        stopped = self._stopped.get(event.step_id)
        if previous is not None and unrecorded is None and stopped is None:
            # (an idempotent tool's step may have a row all the same: claimed by a worker whose definition
            # of the tool was not idempotent; that row is the answer)
            await self._replay(ctx, event, started, previous)
            return
        # A row that exists is kept up to date, whatever this worker's definition of the tool says.
        recorded = recorded or previous is not None
        first = 1 if stopped is None else stopped + 1
        # A runtime retry of this handler after the tool ran but before its row was updated (a database
        # blip) answers from memory instead of "interrupted". With tracing, the execution is a span.
        parent = getattr(ctx, "span", None)
        if unrecorded is None and parent is not None and self._tracing is not None:
            span = self._tracing.start_child(f"tool {tool.name}", parent, {
                "agentstream.tool": tool.name, "agentstream.step_id": event.step_id})
            try:
                outcome = await self._execute(tool, arguments, event, first, recorded=recorded)
                span.set_attribute("agentstream.attempts", outcome.attempts)
                if outcome.error is not None:
                    self._tracing.fail(span, f"{outcome.error_kind}: {outcome.error}"[:500])
            finally:
                span.end()
        else:
            outcome = unrecorded or await self._execute(tool, arguments, event, first, recorded=recorded)
        self._stopped.pop(event.step_id, None)
        if recorded:
            self._unrecorded[event.step_id] = outcome
            finishing = time.perf_counter()
            await self._finish(event, outcome)
            if clock is not None:
                clock.since("tools.finish", finishing)
            del self._unrecorded[event.step_id]
        await self._reply(ctx, event, started, outcome)
        if outcome.error_kind == RETRIES_EXHAUSTED:
            await self._dead_letter(ctx, event, outcome.error or "")

    async def _execute(self, tool: Tool, arguments: dict[str, Any], event: ToolCallRequested,
                       attempt: int = 1, *, recorded: bool = True) -> Outcome:
        """Run the tool, retrying retriable failures with backoff; never raises for the tool's errors,
        only for an outage of this worker's database (the runtime waits it out and calls again).
        ``recorded``: the call has a ``tool_calls`` row, whose ``attempts`` counts the executions."""
        if attempt > 1 and recorded:
            await self.pool.execute("UPDATE tool_calls SET attempts = $2 WHERE step_id = $1", event.step_id, attempt)
        while True:
            context = ToolContext(event.run_id, event.step_id, self.pool, attempt=attempt,
                                  retrieve=self.retrievals.bind(event, attempt), query_pool=self.query_pool)
            try:
                value = await asyncio.wait_for(tool.call(arguments, context), tool.timeout_s)
                return Outcome(attempt, result=json.dumps(value))
            except TimeoutError:
                reason, kind, retriable = (f"{tool.name} timed out after {tool.timeout_s:g} s", "timeout",
                                           tool.retry_on_timeout)
            except ToolError as exc:
                reason, kind, retriable = str(exc), "tool_error", exc.retriable
            except Exception as exc:  # a bug in the tool, or a result json cannot encode: the step's error
                if await self._database_outage(exc):
                    log.warning("tools: %s attempt %d stopped by a database outage (%s: %s); run again when "
                                "it is back", event.step_id, attempt, type(exc).__name__, exc)
                    self._stopped[event.step_id] = attempt
                    raise
                reason, kind, retriable = f"{type(exc).__name__}: {exc}", "tool_error", False
            if not retriable:
                return Outcome(attempt, error=reason, error_kind=kind)
            if attempt >= tool.max_attempts:
                plural = "attempt" if attempt == 1 else "attempts"
                return Outcome(attempt, error=f"failed after {attempt} {plural}: {reason}",
                               error_kind=RETRIES_EXHAUSTED)
            delay = tool.backoff(attempt)
            log.info("tools: %s attempt %d of %d failed (%s); retrying in %.2f s", event.step_id, attempt,
                     tool.max_attempts, reason, delay)
            await asyncio.sleep(delay)
            attempt += 1
            if recorded:
                self._stopped[event.step_id] = attempt - 1  # if the update meets an outage: the next attempt
                await self.pool.execute("UPDATE tool_calls SET attempts = $2 WHERE step_id = $1", event.step_id,
                                        attempt)
                del self._stopped[event.step_id]

    async def _database_outage(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by a tool, is this worker's database being down: an outage error, and
        the database does not answer now. A refused connection to some other service is the tool's error."""
        if outage_of(exc) != DATABASE:
            return False
        try:
            await asyncio.wait_for(self.pool.fetchval("SELECT 1"), 2.0)
        except Exception as probe:
            return outage_of(probe) == DATABASE
        return False

    async def _finish(self, event: ToolCallRequested, outcome: Outcome) -> None:
        await self.pool.execute(
            """UPDATE tool_calls SET status = $2, result = $3::jsonb, error = $4, error_kind = $5, attempts = $6,
                                     finished_at = now()
               WHERE step_id = $1""",
            event.step_id, "failed" if outcome.error is not None else "succeeded",
            None if outcome.result is None else to_json(json.loads(outcome.result)), pg_text(outcome.error),
            outcome.error_kind, outcome.attempts)

    async def _replay(self, ctx: Context, event: ToolCallRequested, started: float, row: EarlierCall) -> None:
        if row.status == "succeeded":
            await self._reply(ctx, event, started, Outcome(row.attempts, result=row.result), replayed=True)
        elif row.status == "failed":
            outcome = Outcome(row.attempts, error=row.error, error_kind=row.error_kind)
            await self._reply(ctx, event, started, outcome, replayed=True)
            if outcome.error_kind == RETRIES_EXHAUSTED:  # the first letter may not have been sent: same id again
                await self._dead_letter(ctx, event, outcome.error or "")
        else:
            log.warning("tools: %s was interrupted mid-execution; not running it again", event.step_id)
            await self._reply(ctx, event, started, Outcome(
                row.attempts, error_kind="interrupted",
                error="interrupted: an earlier attempt started but did not finish; the tool was not run again "
                      "because its effects may already have happened"), replayed=True)

    async def _refuse(self, ctx: Context, event: ToolCallRequested, started: float, verdict: Verdict) -> None:
        """A call its run's record does not allow is never run. If the run asked for exactly this call
        (``Verdict.answers_the_run``), the run gets the refusal as the step's error result. Otherwise
        nothing is published that the planner could apply — a forged request must not answer a real step
        — and the request goes to the dead-letter topic with the reason, under the run id it named."""
        log.warning("tools: refused %s (run %s, tool %s, from %s): %s", event.step_id, event.run_id, event.tool,
                    event.producer.instance, verdict.reason)
        if verdict.answers_the_run:
            await self._reply(ctx, event, started, Outcome(0, error=verdict.reason, error_kind=REFUSED))
            return
        await refuse(self.runtime, ctx, event, service=SERVICE, reason=verdict.reason)
        if self._metrics is not None:
            self._observe(event.tool, REFUSED, time.perf_counter() - started)
        span = getattr(ctx, "span", None)
        if span is not None:
            span.set_attributes({"agentstream.tool": event.tool, "agentstream.refused": verdict.refusal or ""})

    async def _reply(self, ctx: Context, event: ToolCallRequested, started: float, outcome: Outcome, *,
                     replayed: bool = False) -> None:
        duration_s = time.perf_counter() - started
        await ctx.emit(self.runtime.topics.tool_results, ToolCallCompleted.build(
            run_id=event.run_id, step=event.step_id, service=SERVICE, attempt=event.attempt,
            parent_step_id=event.parent_step_id, tool=event.tool, ok=outcome.error is None, result=outcome.result,
            error=outcome.error, duration_ms=duration_s * 1000, replayed=replayed,
            error_kind=outcome.error_kind, attempts=outcome.attempts))
        if self._metrics is not None:
            self._observe(event.tool, outcome.error_kind or "ok", duration_s)
        span = getattr(ctx, "span", None)
        if span is not None:
            span.set_attributes({"agentstream.tool": event.tool, "agentstream.ok": outcome.error is None,
                                     "agentstream.error_kind": outcome.error_kind or "",
                                     "agentstream.attempts": outcome.attempts, "agentstream.replayed": replayed})

    def _observe(self, tool: str, outcome: str, duration_s: float) -> None:
        """Calls and durations by tool; a tool this worker does not serve is counted as ``<unknown>`` (a
        model inventing tool names must not create label series without bound)."""
        key = (tool if tool in self.tools else "<unknown>", outcome)
        children = self._children.get(key)
        if children is None:
            assert self._metrics is not None
            children = self._children[key] = (self._metrics.tool_calls.labels(*key),
                                               self._metrics.tool_seconds.labels(key[0]))
        children[0].inc()
        children[1].observe(duration_s)
        if self._step_seconds is not None:
            self._step_seconds.observe(duration_s)

    async def _dead_letter(self, ctx: Context, event: ToolCallRequested, reason: str) -> None:
        """The request, to the dead-letter topic, as the runtime would put it there — but from here, because
        the handler answers the run as well and returns normally. The step id (hence the event id) is the
        call's, so a letter re-sent on a redelivery is recognisably the same letter."""
        record = ctx.record
        # Sent and acknowledged here, not through ctx.emit: a letter is built to fit and its publish waits
        # out a broker outage (streams/runtime/dead_letters.py). It joins the record's trace through tracing.CURRENT.
        await publish_dead_letter(self.runtime, Rejected(
            run_id=event.run_id, step=f"dlq:{event.step_id}", service=SERVICE, parent_step_id=event.step_id,
            consumer=SERVICE, source_topic=record.topic, source_partition=record.partition,
            source_offset=record.offset, key=record.key, value=self.runtime.codec.encode(event),
            headers=record.headers, error_kind=RETRIES_EXHAUSTED, reason=reason))


class _ToolRunner(ServiceRunner):
    """The tool service's consumer; stops the service's own retrieval consumer when it stops."""

    def __init__(self, service: ToolService, config: ServiceConfig) -> None:
        super().__init__(service.runtime, config, service.handle)
        self.tool_service = service

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            await self.tool_service.close()


class RetrievalWaiter:
    """Lets a tool ask the retrieval service through events, as the planner does, and wait for the answer.

    A request for tool step S is published as RetrievalRequested with step id ``S/retrieve`` (attempt:
    the tool's attempt, so a retry is a new event the retrieval service does not drop as a duplicate) on
    the retrieval requests topic, keyed by the run. One consumer per process, without a group, reads the
    retrieval results topic from its end (positioned before the first request is published) and hands
    each RetrievalCompleted to whoever waits for its step id. The planner's group reads that topic too
    and drops these results: they are not its pending step (services/planner/service.py, ``_on_result``).
    """

    SUFFIX = "/retrieve"

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._waiting: dict[str, asyncio.Future[RetrievalCompleted]] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    def bind(self, event: ToolCallRequested, attempt: int):
        """``ToolContext.retrieve`` for one attempt of one call."""

        async def retrieve(query: str, k: int, collection: str, timeout_s: float) -> RetrievalCompleted:
            return await self.ask(event, attempt, query=query, k=k, collection=collection, timeout_s=timeout_s)

        return retrieve

    async def ask(self, event: ToolCallRequested, attempt: int, *, query: str, k: int, collection: str,
                  timeout_s: float) -> RetrievalCompleted:
        await self._start()
        step = event.step_id + self.SUFFIX
        # Registered before the request is published, so the answer cannot come first; an answer to an
        # earlier attempt that arrives now is as good as this attempt's.
        waiter = self._waiting[step] = asyncio.get_running_loop().create_future()
        request = RetrievalRequested.build(run_id=event.run_id, step=step, service=SERVICE, attempt=attempt,
                                           parent_step_id=event.step_id, query=query, k=k, collection=collection)
        try:
            await (await self.runtime.send(self.runtime.topics.retrieval_requests, request))
            return await asyncio.wait_for(waiter, timeout_s)
        except TimeoutError:
            raise ToolError(f"the retrieval service did not answer within {timeout_s:g} s", retriable=True) from None
        finally:
            if self._waiting.get(step) is waiter:
                del self._waiting[step]

    async def _start(self) -> None:
        async with self._lock:
            if self._consumer is not None:
                return
            settings = self.runtime.settings
            consumer = AIOKafkaConsumer(**settings.kafka_options(), enable_auto_commit=False,
                                        isolation_level="read_committed", fetch_max_wait_ms=100,
                                        client_id="agentstream-tools-retrieval")
            await consumer.start()
            topic = self.runtime.topics.retrieval_results
            tps = [TopicPartition(topic, p) for p in range(self.runtime.topics.partitions)]
            consumer.assign(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                consumer.seek(tp, ends[tp])
            self._consumer = consumer
            self._task = asyncio.create_task(self._loop(consumer), name="tools-retrieval-results")

    async def _loop(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                for msg in messages:
                    try:
                        event = await self.runtime.codec.decode_async(msg.value)
                    except DecodeError:
                        continue
                    if not isinstance(event, RetrievalCompleted):
                        continue
                    waiter = self._waiting.get(event.step_id)
                    if waiter is not None and not waiter.done():
                        waiter.set_result(event)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()
        self._task = self._consumer = None
