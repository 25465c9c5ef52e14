"""`make demo`'s body (``agentstream demo`` after ``dev up``), with the scripted model so it is quick: the
notes are stored, the prefetch finds them, the tool answers, and every step and event is printed."""

from __future__ import annotations

import re
import uuid

import asyncpg
import pytest
from rich.console import Console

from agentstream.demo import SAMPLE_NOTES, SAMPLE_TASK, run_demo
from agentstream.testing import isolated


@pytest.mark.asyncio
async def test_the_demo_runs_every_service_and_prints_each_step(settings, database_url):
    console = Console(record=True, width=200)
    try:
        # A second per model step, as a real model takes at least: the prefetch is back before the
        # model's first step, as it is with SmolLM2 (the instant scripted model could outrun it).
        assert await run_demo("[[slow:1000]] " + SAMPLE_TASK, "scripted", console, timeout=60,
                              settings=isolated(settings, f"t{uuid.uuid4().hex[:8]}."))
    finally:  # other tests use the default collection: leave it as it was
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("DELETE FROM documents WHERE collection = 'default' AND source = $1", str(SAMPLE_NOTES))
        finally:
            await conn.close()
    out = console.export_text()
    assert "notes for retrieval: 2 chunks" in out
    assert re.search(r"step -1  retrieval '\[\[slow:1000\]\] What is 17 \* 23\?' → [1-9]\d* passages", out)
    assert 'tool calculator({"expression": "17 * 23"}) → 391' in out
    assert "step 2  model said" in out  # the last step too, though the run ended right after it
    assert "answer " in out and "391" in out.split("answer ", 1)[1]
    for topic in ("agent.tasks", "agent.inference", "agent.tool", "agent.retrieval"):
        assert topic in out  # the event table names every hop's topic
