"""CPU bombs in the built-in tools (issue 37, finding 4): each fails its call with a clear error, and the
event loop keeps serving meanwhile.

- The calculator's arithmetic is bounded (services/tools/arithmetic.py): ``round(1, -3*10**7)`` (which
  computed 10**30000000 for ~90 s on the event loop), huge powers and products, ``exp(1000)``'s
  OverflowError are refused before anything big is computed.
- What the calculator cannot tell is cheap from its text runs in a child process a timeout kills
  (services/tools/compute.py). The bombs it is tried with here are real ones, in C, holding the GIL
  (``round`` without the bounds, in this module's ``GUARDED``): no thread could be interrupted there.
- ``http_get`` decodes only linear-time charsets: a body declared ``charset=punycode`` (CPython's
  quadratic decoder: 44 s for 1 MB) is read as UTF-8.

A ticker task counts how often the event loop gets to it while a bomb runs; a blocked loop would leave
it at zero. The counts are compared loosely (a few ticks in half a second of computation).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web

from agentstream.services.tools import arithmetic, builtin
from agentstream.services.tools.builtin import calculator, evaluate
from agentstream.services.tools.compute import ComputeError, ComputeGuard, ComputeTimeout
from agentstream.services.tools.http import HttpGetConfig, fetch, safe_charset
from agentstream.services.tools.registry import ToolContext
from agentstream.streams.core.errors import ToolError

BOMB = "round(1, -3*10**7)"


def unbounded_evaluate(expression: str) -> Any:
    """The calculator before issue 37, in effect: Python's own arithmetic, without the bounds."""
    return eval(expression, {"__builtins__": {"round": round}})


def _exit(code: int) -> None:
    os._exit(code)


#: What this module's guarded children may run (ComputeGuard(__name__) in the tests below).
GUARDED: dict[str, Callable[..., Any]] = {
    "round": round, "evaluate": unbounded_evaluate, "exit": _exit, "allocate": lambda n: len(bytearray(n)),
    "echo": lambda x: x}


@contextlib.asynccontextmanager
async def ticker() -> AsyncIterator[list[int]]:
    """Counts (``ticks[0]``) the times the event loop ran it, every 10 ms at most, while the block runs."""
    ticks = [0]

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            ticks[0] += 1

    task = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def guard() -> AsyncIterator[ComputeGuard]:
    instance = ComputeGuard(__name__, workers=2, timeout_s=0.5)
    yield instance
    instance.close()


# -- the calculator's bounded arithmetic ----------------------------------------------------------------

@pytest.mark.parametrize("expression,reason", [
    (BOMB, "round: ndigits must be within ±300"),
    ("round(1, -301)", "ndigits must be within ±300"),
    ("round(2.5, 0.5)", "ndigits must be an integer"),
    ("(10**300)**3", "result out of range"),
    ("10**1000 * 10**1000", "result out of range"),
    ("(9**99)**999", "result out of range"),
    ("2**997 * 2**997", "result out of range"),
    ("9 ** 9 ** 9", "exponent larger than 1000"),
    ("2 ** -1001", "exponent larger than 1000"),
    ("0.5 ** -1000", "result out of range"),
    ("1e300 * 10", "result out of range"),
    ("1e309", "result out of range"),
    ("1" + "0" * 400, "result out of range"),
    ("sqrt(1" + "0" * 400 + ")", "result out of range"),  # (never an int too large to convert to float)
    ("(-8) ** 0.5", "not a real number"),
    ("exp(1000)", "exp: result out of range"),
    ("exp(700)", "result out of range"),
    ("log(0)", "log: math domain error"),
    ("log(-1)", "log: math domain error"),
    ("sqrt(-1)", "sqrt: math domain error"),
    ("log(8, 1)", "log: division by zero"),
    ("1 % 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("min()", "min: "),
    ("(" * 240 + "1" + ")" * 240, "not an arithmetic expression"),
])
def test_calculator_refuses_bombs_with_a_clear_error(expression, reason):
    with pytest.raises(ToolError) as info:
        evaluate(expression)
    assert reason in str(info.value), info.value


@pytest.mark.parametrize("expression,value", [
    ("2 ** 10", 1024), ("2 ** 996", 2 ** 996), ("round(123456, -3)", 123000), ("round(pi, 2)", 3.14),
    ("10 ** 300 // 7 ** 300", 10 ** 300 // 7 ** 300), ("(1 + 0.05) ** 12", 1.05 ** 12), ("-" * 450 + "1", 1),
    ("log(10 ** 300)", 300 * 2.302585092994046),
])
def test_calculator_still_computes_what_is_in_range(expression, value):
    assert evaluate(expression) == pytest.approx(value)


@pytest.mark.parametrize("expression,cheap", [
    ("17 * 23", True), ("sqrt(2) / 3", True), ("2 ** 10", True), ("2 ^ 10", True), ("round(pi, 2)", True),
    ("(1 + 0.05) ** 12", True), ("2 ** -3", True),
    (BOMB, False), ("round(1, n)", False), ("2 ** (3 + 4)", False), ("(2 ** 10) ** 3", False),
    ("9 ** 9 ** 9", False), ("2 ** 1001", False), ("round(1, -301)", False),
])
def test_only_expressions_cheap_whatever_their_numbers_are_evaluated_inline(expression, cheap):
    assert arithmetic.cheap(expression, arithmetic.parse(expression)) is cheap


async def test_the_calculator_tool_refuses_the_bombs_through_either_path():
    ctx = ToolContext("r", "r:1:tool")
    try:
        for expression, reason in [(BOMB, "ndigits must be within ±300"), ("exp(1000)", "result out of range"),
                                   ("(10**300)**3", "result out of range"), ("9 ** 9 ** 9", "exponent larger")]:
            with pytest.raises(ToolError, match=reason):
                await calculator.call({"expression": expression}, ctx)
        assert await calculator.call({"expression": "2 ** (3 + 4)"}, ctx) == 128  # guarded, and served
        assert await calculator.call({"expression": "6 * 7"}, ctx) == 42  # inline
    finally:
        builtin.CALCULATOR_GUARD.close()


# -- the guard ----------------------------------------------------------------------------------------

async def test_the_guard_stops_a_cpu_bomb_while_the_loop_keeps_serving(guard):
    assert await guard.call("echo", 1) == 1  # (the child has started)
    async with ticker() as ticks:
        with pytest.raises(ComputeTimeout, match=r"stopped after 0\.5 s"):
            await guard.call("round", 1, -30_000_000)  # ~90 s of one C call, holding the GIL
        during = ticks[0]
    assert during >= 3, f"the event loop ran the ticker {during} times in 0.5 s"
    assert guard.killed == 1
    assert await guard.call("round", 3.14159, 2) == 3.14  # a new child serves the next call


async def test_a_cancelled_call_kills_its_child_and_others_are_served_meanwhile(guard):
    assert await asyncio.gather(guard.call("echo", 0), guard.call("echo", 1)) == [0, 1]  # two children up
    bomb = asyncio.create_task(guard.call("round", 1, -30_000_000))
    await asyncio.sleep(0.05)
    # The other child serves while the first computes (workers=2).
    assert await guard.call("echo", "still here") == "still here"
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(bomb, 0.2)  # what the tool service's timeout does
    assert guard.killed == 1
    # More calls than children wait for one, and all are answered.
    assert await asyncio.gather(*(guard.call("echo", i) for i in range(5))) == list(range(5))


async def test_a_child_that_dies_or_runs_out_of_memory_fails_only_its_call(guard):
    with pytest.raises(ComputeError, match="process ended"):
        await guard.call("exit", 3)
    with pytest.raises(ComputeError, match="more memory"):
        await guard.call("allocate", 1 << 30)  # over the child's 256 MiB address space
    with pytest.raises(ComputeError, match="KeyError"):
        await guard.call("open", "/etc/passwd")  # only what GUARDED lists
    assert await guard.call("echo", [1, "x"]) == [1, "x"]


async def test_the_calculator_stops_a_bomb_the_bounds_would_miss(monkeypatch):
    # Its guard, with the bounds taken out of the child: the timeout alone must hold.
    unbounded = ComputeGuard(__name__, workers=2, timeout_s=0.5)
    monkeypatch.setattr(builtin, "CALCULATOR_GUARD", unbounded)
    ctx = ToolContext("r", "r:1:tool")
    try:
        assert await unbounded.call("echo", 1) == 1  # (a child has started: its start-up is not the tool's time)
        async with ticker() as ticks:
            with pytest.raises(ToolError, match=r"takes too long to compute \(stopped after 0\.5 s"):
                await asyncio.wait_for(calculator.call({"expression": BOMB}, ctx), calculator.timeout_s)
            during = ticks[0]
        assert during >= 3, f"the event loop ran the ticker {during} times"
        assert await calculator.call({"expression": "6 * 7"}, ctx) == 42
        assert await calculator.call({"expression": "2 ** (3 + 4)"}, ctx) == 128
    finally:
        unbounded.close()


# -- http_get's charsets ----------------------------------------------------------------------------

def test_only_linear_time_text_charsets_are_used():
    assert safe_charset("punycode") == safe_charset("idna") == safe_charset("utf-7") == "utf-8"
    assert safe_charset("rot13") == safe_charset("zlib") == safe_charset("base64") == "utf-8"
    assert safe_charset(None) == safe_charset("no-such-charset") == safe_charset("x\x00") == "utf-8"
    assert (safe_charset("Latin1"), safe_charset("windows-1252"), safe_charset("Shift_JIS")) == \
        ("iso8859-1", "cp1252", "shift_jis")


async def _while_ticking(call: Callable[[], Awaitable[Any]]) -> tuple[Any, float]:
    """``call()``'s result and the longest the event loop left a ticker waiting meanwhile, in seconds."""
    gaps = [0.0]

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0)
            now = time.monotonic()
            gaps[0], last = max(gaps[0], now - last), now

    task = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        return await call(), gaps[0]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_punycode_body_is_read_as_utf8_without_stalling_the_loop():
    body = ("a" * 500_000 + "-" + "b" * 499_999).encode()  # 1 MB: 44 s of CPython's punycode decoder

    async def page(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": "text/plain; charset=punycode"})

    app = web.Application()
    app.add_routes([web.get("/", page)])
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    config = HttpGetConfig(allowed_hosts=frozenset({"127.0.0.1"}), allow_private=True, max_bytes=1_000_000,
                           max_text_chars=10, timeout_s=30.0)
    try:
        result, stall = await _while_ticking(lambda: fetch(f"http://127.0.0.1:{port}/", config))
    finally:
        await runner.cleanup()
    assert result["text"] == "a" * 10 and result["truncated"], result
    # Decoding 1 MB as UTF-8 takes milliseconds; as punycode it held the loop for 44 s.
    assert stall < 5, f"the event loop stalled for {stall:.1f} s"
