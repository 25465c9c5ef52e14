"""Tools the pipeline tests serve: one with a countable side effect, one that takes its time."""

from __future__ import annotations

import asyncio
import weakref

from agentstream.services.tools.registry import ToolContext, tool

#: The table ``effect`` and its siblings write to (each test database gets it from a fixture).
EFFECTS_TABLE = """CREATE TABLE IF NOT EXISTS test_effects (id serial PRIMARY KEY, run_id text NOT NULL,
                   step_id text NOT NULL, label text NOT NULL, at timestamptz NOT NULL DEFAULT now())"""


@tool(description="Record a side effect (a row in test_effects) and say so.")
async def effect(label: str, ctx: ToolContext) -> str:
    assert ctx.pool is not None
    await ctx.pool.execute("INSERT INTO test_effects (run_id, step_id, label) VALUES ($1, $2, $3)",
                           ctx.run_id, ctx.step_id, label)
    return f"recorded {label}"


#: ``GATE`` and ``ENTERED`` (module attributes, ``pipeline_tools.GATE``): set by a test to hold
#: ``gated_effect`` between its start and its write (in-process workers only). One pair per event loop:
#: an asyncio event belongs to the loop that first waits on it, and each test module runs in a loop of
#: its own, so one module-wide pair broke the second module that used it.
_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Event]] = weakref.WeakKeyDictionary()


def _gate() -> dict[str, asyncio.Event]:
    loop = asyncio.get_running_loop()
    if loop not in _GATES:
        _GATES[loop] = {"GATE": asyncio.Event(), "ENTERED": asyncio.Event()}
    return _GATES[loop]


def __getattr__(name: str) -> asyncio.Event:
    if name in ("GATE", "ENTERED"):
        return _gate()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@tool(description="Record a side effect once a test opens the gate.", timeout_s=60)
async def gated_effect(label: str, ctx: ToolContext) -> str:
    assert ctx.pool is not None
    _gate()["ENTERED"].set()
    await _gate()["GATE"].wait()
    await ctx.pool.execute("INSERT INTO test_effects (run_id, step_id, label) VALUES ($1, $2, $3)",
                           ctx.run_id, ctx.step_id, label)
    return f"recorded {label}"


@tool(description="Wait for a number of seconds.", timeout_s=30)
async def sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return f"slept {seconds} s"


@tool(description="Move money (test): records the transfer; needs a person's approval.", requires_approval=True)
async def transfer(amount: float, ctx: ToolContext) -> str:
    assert ctx.pool is not None
    await ctx.pool.execute("INSERT INTO test_effects (run_id, step_id, label) VALUES ($1, $2, $3)",
                           ctx.run_id, ctx.step_id, f"transfer {amount}")
    return f"transferred {amount}"


@tool(description="Return text of the given size (a big tool result).")
async def big(size: int) -> str:
    return "x" * size


@tool(description="Return the text it is given, as it is.")
async def echo(text: str) -> str:
    return text
