"""One MCP server's session, open for the worker's life and reopened when it is lost.

Why a task of its own: the SDK's ``Client`` is an anyio context (a task group, the child process or the
HTTP stream), which must be entered and left by the same task. A ``_Session`` is that task, holding the
client open until told to close; calls from any number of tool executions go through the client
meanwhile (MCP answers concurrent requests by id). Opening one starts the process (stdio) or reaches the
URL (streamable HTTP) and completes MCP's handshake, within ``connect_timeout_s``.

Failures, and what the next call sees:

- a call that takes longer than the server's ``timeout_s`` (reconnecting included) fails with
  "did not answer within"; then a quick check lists the server's tools in the background, and a server
  that does not answer that either is hung as a whole: its session is closed (the process killed) and
  the next call opens a new one. A server that answers the check keeps its session: one slow tool is
  not a reason to cut the others' calls;
- the process exits or the HTTP connection breaks: calls in flight fail at once (the SDK answers them
  "Connection closed"), the session is dropped, and the next call opens a new one;
- the server cannot be reached: the call fails saying so (and the next one tries again).

Each failure is a ``ToolError`` with a message that names the server, so the run's model is told what
happened (or the run fails, as its ``on_tool_error`` says). Whether it is retriable is the tool's call
(``retriable``): only a tool the operator declared idempotent may be run again after a lost answer,
since the server may have acted on the request before the answer was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult
from mcp_types import Tool as McpToolInfo
from pydantic import ValidationError

from agentstream.services.tools.mcp.config import McpServer
from agentstream.streams.core.errors import ToolError, Unavailable

log = logging.getLogger(__name__)

#: Builds the (not yet entered) SDK client for a server; tests pass one that connects in-process.
ClientFactory = Callable[[McpServer], Client]
#: Seconds the check after a timed-out call waits for the server to list its tools (at most half the
#: server's ``timeout_s``: calls made meanwhile wait for its verdict, within their own timeout).
HEALTH_CHECK_S = 5.0
#: Pages of ``tools/list`` read at most (a server whose cursor never ends cannot hold the start forever).
MAX_PAGES = 100


def default_client(server: McpServer) -> Client:
    """The SDK's client for ``server``: a child process over stdio, or streamable HTTP. Its response cache
    is off: a tool listing is read at start and after a reconnect, never served from memory."""
    if server.url is not None:
        return Client(server.url, cache=None)
    params = StdioServerParameters(command=server.command[0], args=list(server.command[1:]),
                                   env=dict(server.env) or None)
    return Client(params, cache=None)


@dataclass
class _Session:
    """An open client and the task that holds it open (until ``closing`` is set)."""

    client: Client
    holder: asyncio.Task[None]
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    #: Set while a check after a timed-out call runs: set when it has decided whether the session stays.
    checked: asyncio.Event | None = None


class McpConnection:
    """The session to one server: ``list_tools`` and ``call``, each opening the session when there is none."""

    def __init__(self, server: McpServer, factory: ClientFactory = default_client) -> None:
        self.server = server
        self._factory = factory
        self._session: _Session | None = None
        self._lock = asyncio.Lock()
        #: Background work: checks after a timed-out call, sessions being closed.
        self._checks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: Sessions opened so far (the first one included): a reconnect adds one.
        self.connects = 0

    @property
    def name(self) -> str:
        return self.server.name

    async def list_tools(self) -> list[McpToolInfo]:
        """Every tool the server lists (all pages), within the server's ``timeout_s`` per page."""
        session = await self._connected()
        tools: list[McpToolInfo] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            try:
                page = await asyncio.wait_for(session.client.list_tools(cursor=cursor), self.server.timeout_s)
            except TimeoutError:
                raise Unavailable(f"MCP server {self.name!r} ({self.server.describe()}) did not list its tools "
                                  f"within {self.server.timeout_s:g} s") from None
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return tools

    async def call(self, tool: str, arguments: dict[str, Any], *, retriable: bool = False) -> CallToolResult:
        """Call the server's tool ``tool``; ``ToolError`` (``retriable`` as given) when no answer comes."""
        session: _Session | None = None
        timeout_s = self.server.timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                session = await self._connected()
                return await session.client.call_tool(tool, arguments)
        except TimeoutError:
            if session is not None:
                self._check_later(session)
            raise ToolError(f"MCP server {self.name!r} did not answer {tool} within {timeout_s:g} s",
                            retriable=retriable) from None
        except Unavailable as exc:
            raise ToolError(str(exc), retriable=retriable) from None
        except MCPError as exc:
            if exc.error.code != CONNECTION_CLOSED:  # the server refused the request (unknown tool, bad params)
                raise ToolError(f"MCP server {self.name!r} refused the call to {tool}: {exc.error.message}") from None
            if session is not None:
                self._drop_soon(session, "its connection closed")
            raise ToolError(f"MCP server {self.name!r} closed the connection during the call to {tool} (its "
                            "process exited, or the connection broke); the next call reconnects",
                            retriable=retriable) from None
        except ValidationError as exc:  # an answer that is not MCP: the session itself may be fine
            raise ToolError(f"MCP server {self.name!r} answered {tool} with a result that is not valid MCP: "
                            f"{_reason(exc)}") from None
        except Exception as exc:  # the transport failed some other way: start over with a new session
            if session is not None:
                self._drop_soon(session, _reason(exc))
            raise ToolError(f"MCP server {self.name!r}: the call to {tool} failed ({_reason(exc)}); the next call "
                            "reconnects", retriable=retriable) from None

    async def close(self) -> None:
        """Close the session (a stdio server's process ends), after the checks and closings under way
        (each bounded: a check by its timeout, a closing by ``_stop``'s)."""
        self._closed = True
        await asyncio.gather(*self._checks, return_exceptions=True)
        if self._session is not None:
            await self._drop(self._session, "the worker is stopping", level=logging.INFO)

    # -- the session ---------------------------------------------------------------------------
    async def _connected(self) -> _Session:
        suspect = self._session
        if suspect is not None and suspect.checked is not None:  # a check runs: not onto a hung session
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(suspect.checked.wait(), self._check_s)
        async with self._lock:
            if self._closed:
                raise Unavailable(f"the connection to MCP server {self.name!r} is closed")
            if self._session is None or self._session.holder.done():
                self._session = await self._open()
            return self._session

    async def _open(self) -> _Session:
        """Start the task that holds a new client open; return once its handshake is done."""
        ready: asyncio.Future[Client] = asyncio.get_running_loop().create_future()
        closing = asyncio.Event()

        async def hold() -> None:
            try:
                async with self._factory(self.server) as client:
                    ready.set_result(client)
                    await closing.wait()
            except Exception as exc:
                if not ready.done():
                    ready.set_exception(exc)
                elif not closing.is_set():
                    log.warning("MCP server %r: the session ended: %s", self.name, _reason(exc))
            finally:
                if not ready.done():
                    ready.set_exception(Unavailable("the connection attempt was stopped"))

        holder = asyncio.create_task(hold(), name=f"mcp-session-{self.name}")
        where = f"MCP server {self.name!r} ({self.server.describe()})"
        try:
            client = await asyncio.wait_for(asyncio.shield(ready), self.server.connect_timeout_s)
        except TimeoutError:
            closing.set()
            await _stop(holder)
            raise Unavailable(f"{where} did not complete MCP's handshake within "
                              f"{self.server.connect_timeout_s:g} s") from None
        except asyncio.CancelledError:  # the caller gave up (its own timeout): no one will use this session
            closing.set()
            holder.cancel()
            raise
        except Exception as exc:
            await _stop(holder)
            raise Unavailable(f"cannot connect to {where}: {_reason(exc)}") from exc
        self.connects += 1
        if self.connects > 1:
            log.info("MCP server %r: reconnected (session %d)", self.name, self.connects)
        return _Session(client, holder, closing)

    async def _drop(self, session: _Session, why: str, *, level: int = logging.WARNING) -> None:
        """Close ``session`` if it is still the current one (the next call opens a new one)."""
        if self._session is session:
            self._session = None
        if not session.closing.is_set():
            log.log(level, "MCP server %r: closing its session (%s)", self.name, why)
        session.closing.set()
        await _stop(session.holder)

    @property
    def _check_s(self) -> float:
        return min(HEALTH_CHECK_S, self.server.timeout_s / 2)

    def _drop_soon(self, session: _Session, why: str) -> None:
        """``_drop`` in the background: a failed call answers at once, not after the session's cleanup
        (a stdio server gets seconds to exit; an HTTP session's goodbye may wait for the network)."""
        if self._session is session:
            self._session = None
        self._background(self._drop(session, why), f"mcp-close-{self.name}")

    def _check_later(self, session: _Session) -> None:
        """After a timed-out call: is the whole server hung? (in the background; one check at a time)"""
        if session.checked is not None or self._closed or session is not self._session:
            return
        session.checked = asyncio.Event()
        self._background(self._check(session, session.checked), f"mcp-check-{self.name}")

    def _background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._checks.add(task)  # (a reference: the loop keeps only weak ones)
        task.add_done_callback(self._checks.discard)

    async def _check(self, session: _Session, checked: asyncio.Event) -> None:
        try:
            await asyncio.wait_for(session.client.list_tools(), self._check_s)
        except Exception as exc:  # (TimeoutError included): hung as a whole, or gone
            if self._session is session:
                self._session = None  # before the verdict: calls waiting for it open a new session
            checked.set()
            await self._drop(session, f"it does not answer a tool listing either ({_reason(exc)})")
        else:
            session.checked = None
        finally:
            checked.set()


async def _stop(holder: asyncio.Task[None], timeout_s: float = 10.0) -> None:
    """Wait for a holder to leave its client (the SDK kills a stdio server that does not exit within
    a few seconds); cancel it past ``timeout_s``."""
    try:
        await asyncio.wait_for(asyncio.shield(holder), timeout_s)
    except TimeoutError:
        holder.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await holder
    except Exception:  # (hold() catches its own errors; this is belt and braces)
        pass


def _reason(exc: BaseException) -> str:
    """The innermost error of ``exc`` (an anyio task group wraps them in groups), as one line."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.error.message
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
