"""Unit-testing tools without Kafka or PostgreSQL.

``ToolEnvironment`` runs one tool the way the tool service runs one attempt of it — arguments checked
against the tool's schema, a ``ToolContext``, the tool's timeout, the result as JSON — and gives back
the result, or raises what the run would hear as an error (``ToolError``, ``ToolArgumentError``,
``TimeoutError``):

    env = ToolEnvironment()
    assert await env.run(add, a=2, b=3) == 5

``ToolHarness`` runs the tool service itself (services/tools/service.py: the check against the run,
the claim, retries, the recorded result) on an ``InMemoryBroker`` and an ``InMemoryDatabase``, for what
only the service decides — how many attempts a flaky tool gets, what a redelivered call answers:

    async with ToolHarness([flaky]) as harness:
        result = await harness.call("flaky", {"n": 1})   # the ToolCallCompleted the run receives
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

import asyncpg

from agentstream.services.tools.registry import Retrieve, Tool, ToolContext
from agentstream.services.tools.service import ToolService
from agentstream.streams.core.errors import ToolError
from agentstream.streams.core.events import Passage, RetrievalCompleted, ToolCallCompleted, ToolCallRequested
from agentstream.streams.core.ids import new_run_id, step_id
from agentstream.testing.broker import Handled, InMemoryBroker
from agentstream.testing.database import InMemoryDatabase

#: Answers a tool's search (``ToolContext.retrieve``): ``(query, k, collection)`` -> the passages.
Search = Callable[[str, int, str], "Sequence[Passage] | Awaitable[Sequence[Passage]]"]


class ToolEnvironment:
    """What a tool sees when the tool service runs it: the call's ids, the attempt, a database pool
    (``pool``: None unless given), and a search (``search``: answers ``ToolContext.retrieve``; without
    it, ``retrieve`` is None, as on a worker without retrieval). ``searches`` records what was asked."""

    def __init__(self, *, run_id: str = "run-test", step_id: str | None = None, attempt: int = 1,
                 pool: Any = None, query_pool: Any = None, search: Search | None = None) -> None:
        self.run_id = run_id
        self.step_id = step_id or f"{run_id}:0:tool"
        self.attempt = attempt
        self.pool = pool
        self.query_pool = query_pool
        self.search = search
        #: Every search the tool asked for: (query, k, collection).
        self.searches: list[tuple[str, int, str]] = []

    def context(self) -> ToolContext:
        """The ``ToolContext`` the tool is given."""
        retrieve = _retrieve(self.search, self.run_id, self.step_id, self.attempt, self.searches)
        return ToolContext(self.run_id, self.step_id, cast(asyncpg.Pool, self.pool), attempt=self.attempt,
                           retrieve=retrieve, query_pool=cast(asyncpg.Pool, self.query_pool))

    async def run(self, tool: Tool[..., Any], arguments: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Any:
        """Run ``tool`` once with ``arguments`` (a mapping, or keyword arguments) and return its result as
        the run receives it: through JSON (a tuple comes back a list). Raises ``ToolArgumentError`` for
        arguments its schema refuses (the tool does not run), what the tool raises (``ToolError``: the
        step's error; ``retriable`` says whether the service would try again), ``TimeoutError`` past the
        tool's ``timeout_s``, and ``TypeError`` for a result JSON cannot encode (a bug the service reports
        as the step's error)."""
        checked = tool.validate({**(arguments or {}), **kwargs})
        value = await asyncio.wait_for(tool.call(checked, self.context()), tool.timeout_s)
        return json.loads(json.dumps(value))

    async def error(self, tool: Tool[..., Any], arguments: Mapping[str, Any] | None = None, /,
                    **kwargs: Any) -> ToolError:
        """The ``ToolError`` ``tool`` raises with these arguments; AssertionError when it returns instead."""
        try:
            value = await self.run(tool, arguments, **kwargs)
        except ToolError as exc:
            return exc
        raise AssertionError(f"{tool.name} returned {value!r} instead of raising ToolError")


class ToolHarness:
    """The tool service with ``tools``, on an in-memory broker and database (``async with`` starts it).

    ``call`` is a call its run asked for; ``deliver`` hands the service any request (a forged one, a
    redelivery), with the run's record as ``database`` holds it. ``search`` answers the tools' searches."""

    def __init__(self, tools: Sequence[Tool[..., Any]], *, broker: InMemoryBroker | None = None,
                 database: InMemoryDatabase | None = None, search: Search | None = None) -> None:
        self.tools = list(tools)
        self.broker = broker or InMemoryBroker()
        self.database = database or InMemoryDatabase()
        self.search = search
        self.searches: list[tuple[str, int, str]] = []
        self._service: ToolService | None = None

    async def __aenter__(self) -> ToolHarness:
        await self.broker.start()
        service = ToolService(self.broker.runtime, cast(asyncpg.Pool, self.database), self.tools)
        service.retrievals = cast(Any, _Searches(self))  # the service's searches, answered here
        self._service = service
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.service.close()
        await self.broker.close()

    @property
    def service(self) -> ToolService:
        if self._service is None:
            raise RuntimeError("the harness is not started: use `async with ToolHarness(tools) as harness:`")
        return self._service

    def request(self, tool: str, arguments: Mapping[str, Any] | str | None = None, *, run_id: str | None = None,
                index: int = 0, attempt: int = 0) -> ToolCallRequested:
        """The ``ToolCallRequested`` the planner would send for step ``index`` of ``run_id`` (default: a new run)."""
        run_id = run_id or new_run_id()
        text = arguments if isinstance(arguments, str) else json.dumps(dict(arguments or {}), sort_keys=True)
        return ToolCallRequested.build(run_id=run_id, step=step_id(run_id, index, "tool"), service="planner",
                                       attempt=attempt, tool=tool, arguments=text)

    async def call(self, tool: str, arguments: Mapping[str, Any] | None = None, *, approved: bool = False,
                   run_id: str | None = None) -> ToolCallCompleted:
        """Call ``tool`` as a run that asked for it (``approved``: and a person approved it) and return the
        result the run receives; AssertionError when the service answered nothing (it refused the call)."""
        request = self.request(tool, arguments, run_id=run_id)
        self.expect(request, approved=approved)
        return (await self.deliver(request)).one(ToolCallCompleted)

    def expect(self, request: ToolCallRequested, *, approved: bool = False) -> None:
        """Record ``request``'s run, waiting for exactly this call, as the planner does before sending it."""
        self.database.expect(request, approved_by="tester" if approved else None,
                             topic_prefix=self.broker.topics.prefix,
                             approval_tools=[t.name for t in self.tools if t.requires_approval])

    async def deliver(self, request: ToolCallRequested) -> Handled:
        """One try of the service's handler on ``request``; what the handler raises is raised here."""
        return await self.broker.deliver(self.service.handle, request, service="tools")


class _Searches:
    """Stands in for the service's ``RetrievalWaiter``: the tools' searches, answered by ``search``."""

    def __init__(self, harness: ToolHarness) -> None:
        self.harness = harness

    def bind(self, event: ToolCallRequested, attempt: int) -> Retrieve | None:
        return _retrieve(self.harness.search, event.run_id, event.step_id, attempt, self.harness.searches)

    async def stop(self) -> None:
        pass


def _retrieve(search: Search | None, run_id: str, step: str, attempt: int,
              searches: list[tuple[str, int, str]]) -> Retrieve | None:
    """``ToolContext.retrieve`` answered by ``search`` (None without one)."""
    if search is None:
        return None

    async def retrieve(query: str, k: int, collection: str, timeout_s: float) -> RetrievalCompleted:
        searches.append((query, k, collection))
        found = search(query, k, collection)
        passages = await found if inspect.isawaitable(found) else found
        return RetrievalCompleted.build(run_id=run_id, step=step + "/retrieve", service="retrieval",
                                        attempt=attempt, parent_step_id=step, passages=list(passages))

    return retrieve


__all__ = ["Search", "ToolEnvironment", "ToolHarness"]
