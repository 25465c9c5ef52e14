"""The tools the chaos suite's tool workers serve (``agentstream worker tools --tools bench.chaos.chaos_tools``).

``chaos_effect`` and ``chaos_transfer`` have an effect outside the run: a row in ``chaos_effects``, a
table with deliberately no unique key, so every execution leaves its own row and a tool that ran twice
for one step shows up as two rows for one ``(run_id, step_id)``. They hold the call open for a moment
after the insert so a worker killed mid-call has a real chance of dying between the effect and its
result (the case the tool service's idempotency record exists for). ``chaos_echo`` is the tool the
poison tool requests name: it hands its text back, so a large payload makes a large result.
"""

from __future__ import annotations

import asyncio

from agentstream.services.tools.registry import ToolContext, tool

EFFECTS_TABLE = "chaos_effects"
#: How long a side-effect call stays open after its insert (seconds): a window for SIGKILL to land in.
EFFECT_HOLD_S = 0.05

CREATE_EFFECTS_TABLE = f"""CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (
    id bigserial PRIMARY KEY, run_id text NOT NULL, step_id text NOT NULL, label text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp())"""


async def _record(ctx: ToolContext, label: str) -> None:
    assert ctx.pool is not None, "the tool service passes its pool"
    await ctx.pool.execute(f"INSERT INTO {EFFECTS_TABLE} (run_id, step_id, label) VALUES ($1, $2, $3)",
                           ctx.run_id, ctx.step_id, label)
    await asyncio.sleep(EFFECT_HOLD_S)


@tool(description="Record a side effect outside the run (one row per execution) and say so.")
async def chaos_effect(label: str, ctx: ToolContext) -> str:
    await _record(ctx, label)
    return f"recorded {label}"


@tool(description="Move money (chaos suite): records the transfer; a person must approve each call.",
      requires_approval=True)
async def chaos_transfer(amount: float, ctx: ToolContext) -> str:
    await _record(ctx, f"transfer {amount}")
    return f"transferred {amount}"


@tool(description="Return the text it is given.")
async def chaos_echo(text: str) -> str:
    return text
