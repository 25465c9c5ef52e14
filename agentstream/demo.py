"""``agentstream demo``: the whole system on one machine, one task, every step shown as it happens.

Starts the local stack (unless KAFKA_BOOTSTRAP_SERVERS / DATABASE_URL name your own), runs the four
services in this process (the llama.cpp backend with SmolLM2-135M when installed, else the scripted
model), stores a few notes for retrieval to find, submits a task, prints each step as the planner
records it, then the answer and the path of every event through Kafka (topic, partition, offset, and
how long each hop took).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.masking import mask_url
from agentstream.streams.config.settings import Settings
from agentstream.streams.core import resources
from agentstream.streams.core.errors import StackError
from agentstream.testing import Pipeline

SAMPLE_TASK = "What is 17 * 23?"
#: Ingested before the task (idempotent: re-running the demo adds nothing), so the planner's retrieval
#: prefetch finds passages instead of an empty collection.
SAMPLE_NOTES = resources.package_path("services", "retrieval", "data", "demo-notes.md")


def pick_backend(requested: str | None) -> str:
    if requested:
        return requested
    try:
        import xllamacpp  # noqa: F401

        from agentstream.services.inference.backends.llamacpp import default_model_path

        default_model_path()
        return "llamacpp"
    except Exception:
        return "scripted"


async def run_demo(task: str, backend: str, console: Console, timeout: float = 180.0,
                   settings: Settings | None = None) -> bool:
    settings = settings or Settings.load()
    if settings.kafka_auth.sasl:
        raise StackError("the demo runs every service and the client in one process, so it needs the plain "
                         "stack: `agentstream dev down --purge && agentstream demo`. On the secure stack, run "
                         "each `agentstream worker SERVICE` and `agentstream submit` (docs/security.md)")
    console.print(f"Kafka [bold]{escape(mask_url(settings.kafka_bootstrap))}[/bold] · "
                  f"PostgreSQL [bold]{escape(mask_url(settings.database_url))}[/bold]")
    console.print(f"starting planner, inference ([bold]{backend}[/bold]), retrieval and tools…")
    t0 = time.perf_counter()
    async with Pipeline.start(settings, WorkerOptions(backend=backend, backend_options=_options(backend))) as pipe:
        console.print(f"services ready in {time.perf_counter() - t0:.1f} s (model loaded, consumer groups joined)")
        await _ingest_notes(pipe, console)
        run_id = await pipe.client.submit(task, tools=["calculator"], max_steps=6)
        console.print(f"[bold]task[/bold] {escape(repr(task))} → run [cyan]{run_id}[/cyan]")
        waiter = asyncio.create_task(pipe.client.wait(run_id, timeout=timeout))
        shown: set[int] = set()
        while True:
            finished = waiter.done()  # before reading the steps, so the last ones are printed too
            status: Mapping[str, Any] = await pipe.client.status(run_id) or {"steps": []}
            for step in status["steps"]:
                if (finished or step["status"] != "requested") and step["step_index"] not in shown:
                    shown.add(step["step_index"])
                    console.print(_describe(step))
            if finished:
                break
            await asyncio.sleep(0.1)
        result = waiter.result()
        if result.ok:
            console.print(f"\n[green bold]answer[/green bold] {escape(result.answer or '')}  "
                          f"({result.steps} steps, {result.duration_ms:.0f} ms)")
        else:
            console.print(f"\n[red bold]failed[/red bold] ({result.error_code}) {escape(result.error or '')}")
        console.print(_timeline(await pipe.client.events(run_id)))
        console.print(f"history: [bold]agentstream status {run_id}[/bold]")
        return result.ok


async def _ingest_notes(pipe: Pipeline, console: Console) -> None:
    from agentstream.services.retrieval.embeddings import Embedder
    from agentstream.services.retrieval.ingest import ingest

    assert pipe.worker.pool is not None
    stats = await ingest(pipe.worker.pool, Embedder(), [SAMPLE_NOTES])  # the retrieval worker's model
    console.print(f"notes for retrieval: {stats.chunks} chunks ({stats.inserted} new) "
                  f"in the default collection\n")


def _options(backend: str) -> dict[str, Any]:
    return {"slots": 2} if backend == "llamacpp" else {}


def _describe(step: Mapping[str, Any]) -> str:
    took = ("" if step["completed_at"] is None
            else f"{(step['completed_at'] - step['requested_at']).total_seconds() * 1000:.0f} ms · ")
    result = step["result"] or {}
    if step["kind"] == "model":
        what = f"model said {result.get('text', '').strip()}"
        detail = f"{result.get('completion_tokens', 0)} tokens, TTFT {result.get('ttft_ms', 0):.0f} ms"
    elif step["kind"] == "tool":
        request = step["request"]
        outcome = result.get("result") if step["status"] == "completed" else f"error: {step['error']}"
        what = f"tool {request['tool']}({json.dumps(request['arguments'])}) → {outcome}"
        detail = "tool service"
    else:
        outcome = (f"{len(result.get('passages', []))} passages" if step["status"] == "completed"
                   else "not back when the run ended" if step["status"] == "requested"
                   else f"error: {step['error']}")
        what = f"retrieval {step['request'].get('query')!r} → {outcome}"
        detail = "retrieval service" + (" (prefetch)" if step["step_index"] < 0 else "")
    return f"  step {step['step_index']}  {escape(what)}   [dim]{took}{detail}[/dim]"


def _timeline(events: Sequence[Mapping[str, Any]]) -> Table:
    table = Table("event", "topic", "partition@offset", "hop ms", "consumed by", title="every step is an event")
    for e in events:
        hop = ""
        if e["consumed_at"] is not None and e.get("appended_at") is not None:
            hop = f"{(e['consumed_at'] - e['appended_at']).total_seconds() * 1000:.1f}"
        where = f"{e['partition']}@{e['offset']}" if e["offset"] is not None else "-"
        table.add_row(e["event_type"], e["topic"], where, hop, e["consumed_by"] or "(client)")
    return table
