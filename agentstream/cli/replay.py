"""``agentstream replay …``: show a run's timeline, re-run it (recorded or live), fork it, diff two runs,
re-run a time window against a candidate model or prompt (agentstream/replay/, streams/replay/). On a secure
stack, show and diff run as the operator's reader, rerun, fork and window as the replay principal and login,
and a tenant's (``AGENTSTREAM_TENANT``) show and diff as the tenant (docs/security.md, "The operator's tools").
"""

from __future__ import annotations

import json
from collections.abc import Coroutine
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table

from agentstream.cli.common import console, err, run_async
from agentstream.streams.config import env
from agentstream.streams.config.identity import CLIENT, Identity
from agentstream.streams.core.errors import AgentStreamError, ConfigError

if TYPE_CHECKING:
    from agentstream.streams.config.settings import Settings

app = typer.Typer(help="Replay runs for debugging: timeline, deterministic re-execution, fork, per-step diff. On a "
                       "secure stack show and diff read as operator-reader, rerun, fork and window run as replay; "
                       "with AGENTSTREAM_TENANT a tenant shows and diffs its own runs (docs/security.md).",
                  no_args_is_help=True, pretty_exceptions_enable=False)
T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop like the other commands; a known error is one line and exit 2."""
    try:
        return run_async(coro)
    except AgentStreamError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None


#: Who each kind of replay command is on the local secure stack (docs/security.md, "The operator's tools"):
#: reading a run (show, diff) is the operator's reader's, re-running one (rerun, fork, window) the replays'
#: own principal and login, which write replay pipelines and nothing else (migration 0023).
READER = Identity(principal="operator-reader", database_login="operator-reader")
RERUNNER = Identity(principal="replay", database_login="replay")


def identity(*, rerun: bool) -> Identity:
    """The identity of a replay command. A process working for a tenant (``AGENTSTREAM_TENANT``) is the
    tenant (its principal and login: its own runs only), and only reads: re-running takes a pipeline of
    topics, workers and run rows that a tenant's rights do not include."""
    if env.tenant():
        if rerun:
            raise ConfigError(f"re-running a run is the operator's (the replay login); as tenant {env.tenant()} "
                              "use `agentstream replay show` and `replay diff`, or run without AGENTSTREAM_TENANT")
        return CLIENT
    return RERUNNER if rerun else READER


def _settings(*, rerun: bool = False) -> Settings:
    """On a secure stack: ``identity``'s principal and login, never the schema owner's."""
    from agentstream.streams.config.settings import Settings

    try:
        return Settings.load(identity=identity(rerun=rerun))
    except ConfigError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None


def _options(backend: str, model: str | None, tool_modules: list[str] | None):
    from agentstream.services.worker import WorkerOptions

    backend_options: dict[str, Any] = {}
    if model and backend != "scripted":
        backend_options["model_path" if backend == "llamacpp" else "model"] = model
    return WorkerOptions(backend=backend, backend_options=backend_options,
                         tool_modules=tuple(tool_modules) if tool_modules else ("agentstream.services.tools.builtin",))


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- show -----------------------------------------------------------------------------------------

@app.command()
def show(run_id: str,
         html: Path = typer.Option(None, "--html", help="Also write the timeline as one self-contained HTML file."),
         as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
         no_kafka: bool = typer.Option(False, "--no-kafka", help="Skip the cross-check against Kafka.")) -> None:
    """A run's timeline from PostgreSQL, every event cross-checked in Kafka."""
    from agentstream.streams.replay import timeline as tl_mod

    tl = _run(tl_mod.show(_settings(), run_id, check=not no_kafka))
    if tl is None:
        err.print(f"[red]error:[/red] no run {run_id}")
        raise typer.Exit(2)
    children = _children(tl, lambda child: _run(tl_mod.show(_settings(), child, check=not no_kafka)))
    if html is not None:
        from agentstream.replay.html import render

        html.write_text(render(tl, children), encoding="utf-8")
    if as_json:
        print(json.dumps(tl.as_dict(), default=str))
        return
    print_tree(tl, children)
    if html is not None:
        console.print(f"timeline written to {html}")


def _children(tl, load) -> dict:
    """The timelines of the sub-agents' runs ``tl``'s steps started, and theirs (a tree of agents:
    services/planner/subagents.py): step index → (timeline, its children)."""
    out = {}
    for s in tl.steps:
        child = s.request.get("child_run_id") if s.kind == "tool" else None
        sub = load(child) if child else None
        if sub is not None:
            out[s.index] = (sub, _children(sub, load))
    return out


def print_tree(tl, children: dict, depth: int = 0) -> None:
    """The run's timeline, and under each of its sub-agent calls the child run's, indented."""
    print_timeline(tl, depth)
    for index, (sub, grandchildren) in children.items():
        step = next(s for s in tl.steps if s.index == index)
        console.print(Padding(f"└ step {index} ran {escape(step.request.get('agent') or 'an agent')} as run "
                              f"{sub.run['run_id']}:", (1, 0, 0, 4 * depth)))
        print_tree(sub, grandchildren, depth + 1)


def print_timeline(tl, depth: int = 0) -> None:
    run = tl.run
    table = Table("#", "step", "queue/compute/back ms", "tokens p/c/cached · TTFT", "request → result",
                  title=f"{run['run_id']} · {run['status']}"
                  + (f" · replay of {run['replay_of']}" if run.get("replay_of") else ""))
    for s in tl.steps:
        r = s.result or {}
        usage = ""
        if s.kind == "model":
            request, result = f"{s.request.get('messages', '')} messages", r.get("text", "")
            usage = (f"{s.usage('prompt_tokens'):.0f}/{s.usage('completion_tokens'):.0f}/"
                     f"{s.usage('cached_prompt_tokens'):.0f} · {_ms(s.usage('ttft_ms'))}")
        elif s.kind == "tool" and s.request.get("child_run_id"):  # a sub-agent's run
            request, result = f"{s.request.get('agent')}: {s.request.get('task')!r}", r.get("result")
        elif s.kind == "tool":
            request, result = f"{s.request.get('tool')}({json.dumps(s.request.get('arguments'))})", r.get("result")
        else:
            request = repr(s.request.get("query", "")) + (" (from prefetch)" if s.from_prefetch else "")
            result = f"{len(r.get('passages') or [])} passages"
        timing = "/".join(_ms(v) or "-" for v in (s.queue_ms, s.compute_ms, s.transport_ms))
        shown = f"[red]{escape(_short(s.error))}[/red]" if s.error else escape(_short(result or "", 80))
        table.add_row(str(s.index), f"{escape(s.label.partition(' ')[2])} [dim]({s.service}, {s.status})[/dim]", timing, usage,
                      f"{escape(_short(request, 60))} → {shown}")
    console.print(Padding(table, (0, 0, 0, 4 * depth)) if depth else table)
    if depth:
        return  # a child's: its table only
    b = tl.budget()
    console.print(f"wall {b.wall_ms:.1f} ms · transport+queues {b.transport_ms:.1f} ms ({b.share(b.transport_ms):.0%}) "
                  f"· compute {b.compute_ms:.1f} ms ({b.share(b.compute_ms):.0%}) · planner {b.planner_ms:.1f} ms "
                  f"({b.share(b.planner_ms):.0%}) · other {b.other_ms:.1f} ms ({b.share(b.other_ms):.0%})")
    counts = tl.kafka_counts()
    colour = "green" if not (counts.get("missing") or counts.get("mismatched")) else "yellow"
    console.print(f"Kafka cross-check: [{colour}]" + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
                  + f"[/{colour}]" + (f" · shown in {tl.timings['total_ms']:.1f} ms" if tl.timings else ""))
    bad = [e for e in tl.events if e.kafka in ("missing", "mismatched")]
    for e in bad[:5]:
        console.print(escape(f"  {e.kafka}: {e.event_type} {e.topic}[{e.partition}]@{e.offset}: {e.kafka_note}"))
    if len(bad) > 5:
        console.print(f"  … and {len(bad) - 5} more (--json lists them all)")
    if run["status"] == "completed":
        console.print(f"[green]answer:[/green] {escape(run['answer'] or '')}")
    elif run["status"] == "failed":
        console.print(f"[red]failed ({run['error_code']}):[/red] {escape(run['error'] or '')}")


# -- rerun / fork ---------------------------------------------------------------------------------

def _overrides(model: str | None, system_prompt: str | None, tools: str | None):
    from agentstream.replay.rerun import Overrides

    return Overrides(model=model, system_prompt=system_prompt,
                     tools=[t for t in tools.split(",") if t] if tools is not None else None)


def _report(result, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result.as_dict(), default=str))
    else:
        r = result.result
        console.print(f"{result.mode} rerun of [bold]{result.original['run_id']}[/bold] → run [bold]{r.run_id}[/bold]: "
                      f"{r.status} in {r.duration_ms:.1f} ms (original {result.original_ms:.1f} ms, "
                      f"{result.speedup:.1f}x faster)")
        print_diff(result.diff)
    if not result.finished or (result.mode == "recorded" and not result.same_decisions):
        raise typer.Exit(1)


@app.command()
def rerun(run_id: str,
          mode: str = typer.Option("recorded", help="recorded: results from the record (no model, no side "
                                                    "effects); live: recompute with real services."),
          model: str = typer.Option(None, help="The model for the rerun (task field; backend model for live)."),
          system_prompt: str = typer.Option(None, help="A different system prompt."),
          tools: str = typer.Option(None, help="Comma-separated tools the rerun may call."),
          backend: str = typer.Option("scripted", help="live: the inference backend (scripted, llamacpp, …)."),
          tool_module: list[str] = typer.Option(None, "--tool-module", help="live: module(s) of @tool functions."),
          keep_topics: bool = typer.Option(False, help="Keep the replay's topics afterwards."),
          timeout: float = typer.Option(300.0, help="Seconds to wait for the rerun."),
          as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Re-execute a run on an isolated pipeline (its own topic prefix and workers) and compare decisions.
    Exit 0 only if it finished (and, recorded, made the same decisions)."""
    from agentstream.replay.rerun import rerun as do_rerun

    if mode not in ("recorded", "live"):
        err.print("[red]error:[/red] --mode is recorded or live (forks: agentstream replay fork)")
        raise typer.Exit(2)
    result = _run(do_rerun(_settings(rerun=True), run_id, mode=mode, overrides=_overrides(model, system_prompt, tools),
                           options=_options(backend, model, tool_module), keep_topics=keep_topics, timeout=timeout))
    _report(result, as_json)


@app.command()
def fork(run_id: str,
         from_step: int = typer.Option(..., "--from-step", help="Steps before N come from the record; N on run live."),
         model: str = typer.Option(None, help="The model for the live steps."),
         system_prompt: str = typer.Option(None, help="A different system prompt."),
         tools: str = typer.Option(None, help="Comma-separated tools the fork may call."),
         backend: str = typer.Option("scripted", help="The inference backend for the live steps."),
         tool_module: list[str] = typer.Option(None, "--tool-module", help="Module(s) of @tool functions."),
         keep_topics: bool = typer.Option(False, help="Keep the fork's topics afterwards."),
         timeout: float = typer.Option(300.0, help="Seconds to wait for the fork."),
         as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """A new run seeded with the recorded steps before N, live from N."""
    from agentstream.replay.rerun import rerun as do_rerun

    if from_step < 0:
        err.print("[red]error:[/red] --from-step must be 0 or more")
        raise typer.Exit(2)
    result = _run(do_rerun(_settings(rerun=True), run_id, from_step=from_step,
                           overrides=_overrides(model, system_prompt, tools),
                           options=_options(backend, model, tool_module), keep_topics=keep_topics, timeout=timeout))
    _report(result, as_json)


# -- diff -----------------------------------------------------------------------------------------

def print_diff(d, depth: int = 0) -> None:
    styles = {"same": "green", "result": "yellow", "changed": "red", "only_a": "red", "only_b": "red"}
    table = Table("#", "kind", "status", d.run_a, d.run_b, "ms a", "ms b", "notes",
                  title=f"{d.run_a} vs {d.run_b}")
    for s in d.steps:
        kind = s.kind_a if s.kind_a == s.kind_b else f"{s.kind_a} / {s.kind_b}"
        table.add_row(str(s.index), kind, f"[{styles[s.status]}]{s.status}[/{styles[s.status]}]",
                      escape(_short(s.decision_a or "-", 45)), escape(_short(s.decision_b or "-", 45)),
                      _ms(s.total_ms_a), _ms(s.total_ms_b), escape(_short("; ".join(s.notes), 50)))
    console.print(Padding(table, (0, 0, 0, 4 * depth)) if depth else table)
    verdict = "[red]decisions differ[/red]" if d.decisions_changed else "[green]same decisions[/green]"
    console.print(Padding(f"outcome: {escape(repr(_short(d.outcome_a, 70)))} vs "
                          f"{escape(repr(_short(d.outcome_b, 70)))} · {verdict}", (0, 0, 0, 4 * depth)))


@app.command()
def diff(run_a: str, run_b: str, as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Align two runs' steps and show what differs, and under each step where both called a sub-agent, the
    children's runs the same way; exit 1 when decisions differ anywhere in the tree."""
    found = _run(_summaries(run_a, run_b))
    missing = [r for r in (run_a, run_b) if r not in found]
    if missing:
        err.print(f"[red]error:[/red] no run {', '.join(missing)}")
        raise typer.Exit(2)
    from agentstream.streams.replay.diff import diff_tree

    tree = diff_tree(found[run_a], found[run_b], lambda a, b: _run(_summaries(a, b)))
    if as_json:
        print(json.dumps(tree.to_dict(), default=str))
    else:
        _print_tree_diff(tree)
    raise typer.Exit(1 if tree.changed else 0)


async def _summaries(*run_ids: str) -> dict:
    from agentstream.streams.replay.timeline import summaries
    from agentstream.streams.store import db

    pool = await db.create_pool(_settings().database_url, min_size=1, max_size=2)
    try:
        return await summaries(pool, list(run_ids))
    finally:
        await pool.close()


def _print_tree_diff(tree: Any, depth: int = 0) -> None:
    print_diff(tree.run, depth)
    for index, child in tree.children.items():
        console.print(Padding(f"└ step {index}: the sub-agents' runs", (1, 0, 0, 4 * depth)))
        _print_tree_diff(child, depth + 1)


# -- window ---------------------------------------------------------------------------------------

@app.command()
def window(since: datetime = typer.Option(..., help="ISO time: first submission included."),
           until: datetime = typer.Option(None, help="ISO time: end (excluded; default: now)."),
           mode: str = typer.Option("live", help="live (a candidate model or prompt) or recorded."),
           model: str = typer.Option(None, help="The candidate model."),
           system_prompt: str = typer.Option(None, help="The candidate system prompt."),
           tools: str = typer.Option(None, help="Comma-separated tools."),
           backend: str = typer.Option("scripted", help="The inference backend."),
           tool_module: list[str] = typer.Option(None, "--tool-module", help="Module(s) of @tool functions."),
           limit: int = typer.Option(100, help="Most runs to re-run."),
           concurrency: int = typer.Option(8, help="Reruns in flight at once."),
           timeout: float = typer.Option(300.0, help="Seconds to wait for each rerun."),
           as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Re-run every task submitted in a window (not replays) and report aggregate differences."""
    from datetime import UTC

    from agentstream.replay.rerun import window as do_window

    if mode not in ("recorded", "live"):
        err.print("[red]error:[/red] --mode is live or recorded")
        raise typer.Exit(2)
    until = until or datetime.now(UTC)
    since, until = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (since, until))
    out = _run(do_window(_settings(rerun=True), since, until, mode=mode, overrides=_overrides(model, system_prompt, tools),
                         options=_options(backend, model, tool_module), limit=limit, concurrency=concurrency,
                         timeout=timeout))
    report = out.report().to_dict()
    report["errors"] = out.errors
    if as_json:
        print(json.dumps(report, default=str))
    else:
        console.print(f"{report['runs']} runs re-run ({mode}) from {since.isoformat()} to {until.isoformat()}")
        table = Table("", "original", "rerun", "delta")
        for key in ("completed", "failed"):
            table.add_row(key, str(report[key]["original"]), str(report[key]["rerun"]),
                          f"{report[key]['rerun'] - report[key]['original']:+d}")
        table.add_row("tokens", str(report["tokens"]["original"]), str(report["tokens"]["rerun"]),
                      f"{report['tokens']['delta']:+d}")
        t = report["ttft_p50_ms"]
        table.add_row("TTFT p50 ms", _ms(t["original"]), _ms(t["rerun"]), _ms(t["delta"]))
        console.print(table)
        console.print(f"decisions changed in {report['decisions_changed']} of {report['runs']} runs")
        for pair in report["changed_runs"]:
            console.print(f"  agentstream replay diff {pair['original']} {pair['rerun']}")
        for run_id, error in out.errors.items():
            console.print(f"  [red]{run_id}: {error}[/red]")
    if out.errors:
        raise typer.Exit(1)
