"""The ``agentstream`` command: a thin Typer front over the modules that do the work."""

from __future__ import annotations

import json
import sys
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentstream.approvals_cli import register as register_approvals
from agentstream.replay.cli import app as replay_app
from agentstream.streams.core.errors import AgentStreamError
from agentstream.streams.core.extras import missing_extra

app = typer.Typer(help="agentstream: AI agents as event streams on Apache Kafka.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
dev = typer.Typer(help="The local development stack: Kafka (KRaft) and PostgreSQL + pgvector.",
                  no_args_is_help=True)
app.add_typer(dev, name="dev")
app.add_typer(replay_app, name="replay")

console = Console()
err = Console(stderr=True)
T = TypeVar("T")


@dev.command("up")
def dev_up(
    kafka_port: int = typer.Option(None, help="Broker port on 127.0.0.1 (controller: the next port)."),
    pg_port: int = typer.Option(None, help="PostgreSQL port on 127.0.0.1."),
    brokers: int = typer.Option(None, min=1, help="Kafka nodes: 1 (the default), or a cluster (3: every topic "
                                                 "has 3 replicas, writes need 2), on ports N, N+2, N+4."),
    secure: bool = typer.Option(None, "--secure/--insecure",
                                help="Kafka with SASL/SCRAM, a principal per service and ACLs (docs/security.md); "
                                     "default: as the stack was started. Switching needs `dev down --purge`."),
    tenant: list[str] = typer.Option(None, "--tenant", help="With --secure: a tenant (repeatable): its own topic "
                                                          "prefix NAME., Kafka principal tenant-NAME and database "
                                                          "logins (docs/security.md, \"Tenants\")."),
) -> None:
    """Start Kafka and PostgreSQL (if not running), apply migrations, print where they listen."""
    from agentstream.devstack.stack import DevStack
    from agentstream.streams.config.settings import mask_url

    stack = DevStack()
    with console.status("starting Kafka and PostgreSQL…"):
        status = stack.up(kafka_port=kafka_port, pg_port=pg_port, brokers=brokers, secure=secure,
                          tenants=tuple(tenant) if tenant else None)
    console.print(f"[green]stack is up[/green]\n  KAFKA_BOOTSTRAP_SERVERS={escape(mask_url(status.kafka))}\n"
                  f"  DATABASE_URL={escape(mask_url(status.database_url))}")
    if status.secure:
        console.print(f"  Kafka: SASL_PLAINTEXT, SCRAM-SHA-512; each principal's password in "
                      f"{escape(str(stack.secrets_dir))}/<principal>.password")


@dev.command("down")
def dev_down(purge: bool = typer.Option(False, help="Also delete the broker's and database's data.")) -> None:
    """Stop the local stack (never a cluster named by KAFKA_BOOTSTRAP_SERVERS / DATABASE_URL)."""
    from agentstream.devstack.stack import DevStack

    stopped = DevStack().down(purge=purge)
    console.print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@dev.command("status")
def dev_status(as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Show where Kafka and PostgreSQL are and whether they are running (exit 1 when not). Passwords in
    the URLs are masked; the stack's own are in its state file (stack.json, readable by its owner only)."""
    from agentstream.devstack.stack import DevStack
    from agentstream.streams.config.settings import mask_url

    status = DevStack().status()
    if as_json:
        print(json.dumps(status.public()))
    else:
        table = Table(show_header=True, header_style="bold")
        table.add_column("service")
        table.add_column("address")
        table.add_column("running")
        table.add_column("pid")
        if len(status.brokers) > 1:
            for broker in status.brokers:
                table.add_row(f"kafka {broker.node_id}", escape(mask_url(broker.address)), _yes(broker.running),
                              str(broker.pid or "-"))
        else:
            table.add_row("kafka", escape(mask_url(status.kafka)), _yes(status.kafka_running),
                          str(status.kafka_pid or "-"))
        table.add_row("postgres", escape(mask_url(status.database_url)), _yes(status.postgres_running),
                      str(status.postgres_pid or "-"))
        console.print(table)
    raise typer.Exit(0 if status.running else 1)


@dev.command("check")
def dev_check() -> None:
    """Produce, consume and commit a record on a throwaway topic and round-trip a vector."""
    import asyncio

    from agentstream.devstack.check import run_check
    from agentstream.streams.config.settings import Settings, mask_url, use_kafka_principal

    use_kafka_principal("admin")  # on a secure stack: a throwaway topic is the administrator's to create
    settings = Settings.load()
    table = Table("step", "result", "ms", title=escape(f"Kafka {mask_url(settings.kafka_bootstrap)} · "
                                                       f"{mask_url(settings.database_url)}"))
    for step in asyncio.run(run_check(settings)):
        table.add_row(step.name, step.detail, f"{step.ms:.1f}")
    console.print(table)


@app.command()
def submit(
    task: str = typer.Argument(..., help="What the agent should do."),
    tools: str = typer.Option(None, help="Comma-separated tools the run may call (default: all registered)."),
    max_steps: int = typer.Option(8, help="Most steps (model, tool and retrieval) the run may take."),
    deadline: float = typer.Option(None, help="Seconds from now after which the run fails."),
    wait: bool = typer.Option(False, "--wait", help="Wait for the outcome and print it."),
    follow: bool = typer.Option(False, "--follow", help="Print the model's tokens as they are generated."),
    timeout: float = typer.Option(300.0, help="Seconds --wait waits."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Publish a task to agent.tasks (refused with a clear message if it is invalid)."""
    import asyncio

    from agentstream.streams.client.agent_client import AgentClient

    async def go() -> dict:
        async with AgentClient() as client:
            run_id = await client.submit(task, tools=tools.split(",") if tools else None, max_steps=max_steps,
                                         deadline=deadline)
            if follow:
                console.print(f"run [bold]{run_id}[/bold]")
                step = None
                async for token in client.stream(run_id):
                    if token.step_id != step:
                        step = token.step_id
                        console.print(f"\n[dim]{step}[/dim] ", end="")
                    console.print(token.text, end="", markup=False, highlight=False)
                console.print()
            if not (wait or follow):
                return {"run_id": run_id}
            result = await client.wait(run_id, timeout=timeout)
            return {"run_id": run_id, "status": result.status, "answer": result.answer,
                    "error_code": result.error_code, "error": result.error, "steps": result.steps,
                    "duration_ms": round(result.duration_ms, 1), "_status": await client.status(run_id)}

    out = asyncio.run(go())
    details = out.pop("_status", None)
    if as_json:
        print(json.dumps(out))
    else:
        if not follow:
            console.print(f"run [bold]{out['run_id']}[/bold]")
        if details:
            print_run(details)
    if (wait or follow) and out.get("status") != "completed":
        raise typer.Exit(1)


register_approvals(app)  # approve, deny, approvals: agentstream/approvals_cli.py


@app.command()
def cancel(run_id: str, reason: str = typer.Option("", help="Why (recorded with the run).")) -> None:
    """Stop a run: it fails with error_code 'cancelled' and a generation in progress is aborted."""
    import asyncio

    from agentstream.streams.client.agent_client import AgentClient

    async def go() -> None:
        async with AgentClient() as client:
            await client.cancel(run_id, reason)

    asyncio.run(go())
    console.print(f"cancellation of {run_id} requested")


@app.command()
def ingest(
    paths: list[str] = typer.Argument(..., help="Files or directories (text and markdown, recursively)."),
    collection: str = typer.Option("default", help="Collection to add the chunks to."),
    chunk_chars: int = typer.Option(700, help="Most characters per chunk."),
    overlap: int = typer.Option(100, help="Characters repeated between consecutive chunks."),
    as_json: bool = typer.Option(False, "--json", help="Print the stats as one JSON object."),
) -> None:
    """Chunk, embed and store text/markdown files for retrieval (re-ingesting adds only what is new)."""
    from agentstream.services.retrieval.ingest import run_ingest_cli
    from agentstream.streams.config.settings import use_database_login

    use_database_login("postgres")  # the corpus is written with the schema owner's login (docs/security.md)
    stats = run_ingest_cli(paths, collection, err if as_json else console, chunk_chars=chunk_chars,
                           overlap=overlap)
    if as_json:
        print(json.dumps(stats.as_dict()))


@app.command()
def status(run_id: str, as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
           operator: bool = typer.Option(False, "--operator", help="Read as the operator's reader: any cell's "
                                                                   "run (local secure stack; docs/security.md).")
           ) -> None:
    """A run's status and steps (from PostgreSQL; a client's login sees its own cell's runs only)."""
    import asyncio

    from agentstream.approvals_cli import OPERATOR_READER
    from agentstream.streams.client.agent_client import AgentClient
    from agentstream.streams.config.settings import use_database_login

    if operator:
        use_database_login(OPERATOR_READER)

    async def go() -> Mapping[str, Any] | None:
        async with AgentClient() as client:
            return await client.status(run_id)

    details = asyncio.run(go())
    if details is None:
        err.print(f"[red]error:[/red] no run {escape(run_id)}" + ("" if operator else " that this login may read "
                                                                  "(--operator: any cell's)"), soft_wrap=True)
        raise typer.Exit(2)
    if as_json:
        print(json.dumps(details, default=str))
    else:
        print_run(details)


def print_run(details: Mapping[str, Any]) -> None:
    """The run's steps as a table, then its answer or error."""
    table = Table("#", "kind", "status", "request", "result", "ms", title=f"{details['run_id']} · {details['status']}")
    for step in details["steps"]:
        ms = ""
        if step["completed_at"] and step["requested_at"]:
            ms = f"{(step['completed_at'] - step['requested_at']).total_seconds() * 1000:.0f}"
        table.add_row(str(step["step_index"]), step["kind"], step["status"], _short(step["request"]),
                      _short(step["result"] if step["error"] is None else {"error": step["error"]}), ms)
    console.print(table)
    if details["status"] == "completed":
        console.print(f"[green]answer:[/green] {details['answer']}")
    elif details["status"] == "failed":
        console.print(f"[red]failed ({details['error_code']}):[/red] {details['error']}")


def _short(value: object, limit: int = 70) -> str:
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in ("duration_ms", "prompt_tokens", "completion_tokens",
                                                           "cached_prompt_tokens", "ttft_ms", "replayed", "ok")}
        if set(value) >= {"text", "finish_reason"}:
            value = value["text"]
        elif "result" in value and "tool" in value:
            value = value["result"]
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@app.command()
def worker(
    service: str = typer.Argument(..., help="planner, inference, retrieval, tools, or all"),
    backend: str = typer.Option("scripted", help="Model backend: scripted, llamacpp, openai or trtllm."),
    slots: int = typer.Option(None, help="Generations the engine runs at once (the service's concurrency)."),
    model: str = typer.Option(None, help="Model: a name for openai, a path or HF id for trtllm/llamacpp."),
    base_url: str = typer.Option(None, help="openai: the server's base URL, e.g. http://127.0.0.1:8000/v1."),
    threads: int = typer.Option(None, help="llamacpp: CPU threads for the engine (default: all cores)."),
    max_seq_len: int = typer.Option(None, help="trtllm: prompt + generated tokens of one sequence (default: "
                                                "AGENTSTREAM_TRTLLM_MAX_SEQ_LEN, else the model's context length)."),
    max_num_tokens: int = typer.Option(None, help="trtllm: tokens of one engine step (default: "
                                                   "AGENTSTREAM_TRTLLM_MAX_NUM_TOKENS, else TensorRT-LLM's)."),
    chunked_prefill: bool | None = typer.Option(None, "--chunked-prefill/--no-chunked-prefill",
                                         help="trtllm: prefill long prompts over several steps (default: on, "
                                              "AGENTSTREAM_TRTLLM_CHUNKED_PREFILL)."),
    http_allow: list[str] = typer.Option(None, "--http-allow", help="Serve http_get for this host (repeatable; "
                                                                    "default: AGENTSTREAM_HTTP_ALLOWED_HOSTS, else off)."),
    tools_module: list[str] = typer.Option(None, "--tools", help="Module(s) of @tool functions to serve "
                                                                  "(default: the built-ins)."),
    log_level: str = typer.Option("INFO", help="Python log level."),
    metrics_port: int = typer.Option(None, help="Serve /metrics, /healthz, /readyz on this port (0: any free "
                                                "port; default: AGENTSTREAM_METRICS_PORT, else off)."),
) -> None:
    """Run one service (or all four) until interrupted."""
    import dataclasses
    import logging

    from agentstream.services.tools.builtin import BuiltinConfig
    from agentstream.services.tools.http import HttpGetConfig
    from agentstream.services.worker import SERVICES, WorkerOptions, serve
    from agentstream.streams.config.settings import (
        TrtLlmSettings,
        model_api_key,
        tool_environment,
        use_kafka_principal,
    )

    use_kafka_principal("worker" if service == "all" else service)  # on a secure stack: its own principal
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = list(SERVICES) if service == "all" else [service]
    backend_options: dict = {"slots": slots} if slots else {}
    if model:
        backend_options["model_path" if backend == "llamacpp" else "model"] = model
    if base_url:
        backend_options["base_url"] = base_url
    if threads:
        backend_options["threads"] = threads
    if backend == "openai" and model_api_key():
        backend_options["api_key"] = model_api_key()
    if backend == "trtllm":
        limits = TrtLlmSettings.load()
        limits = dataclasses.replace(
            limits, max_seq_len=max_seq_len or limits.max_seq_len, max_num_tokens=max_num_tokens or limits.max_num_tokens,
            chunked_prefill=limits.chunked_prefill if chunked_prefill is None else chunked_prefill)
        backend_options.update(limits.backend_options())
    builtin = BuiltinConfig.from_env(tool_environment())
    if http_allow:
        builtin = dataclasses.replace(builtin, http_get=HttpGetConfig.parse_hosts(http_allow))
    options = WorkerOptions(backend=backend, backend_options=backend_options, builtin=builtin,
                            tool_modules=tuple(tools_module) if tools_module else ("agentstream.services.tools.builtin",),
                            metrics_port=metrics_port)
    run_async(serve(names, options))


@app.command()
def top(
    endpoints: str = typer.Option(None, help="Metrics endpoints host:port,… (default: the workers registered "
                                             "in PostgreSQL under this topic prefix)."),
    interval: float = typer.Option(2.0, help="Seconds between scrapes (rates are over this interval)."),
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit."),
) -> None:
    """Live dashboard of the workers: steps/s by service, runs/s, lag, backlog, TTFT, tokens/s, errors."""
    from agentstream.ops.top import run_top

    try:
        status = run_async(run_top(endpoints, interval, once, Console()))
    except KeyboardInterrupt:
        status = 0
    raise typer.Exit(status)


@app.command()
def alerts(
    log_level: str = typer.Option("info", help="faust worker log level."),
    from_start: bool = typer.Option(False, "--from-start", help="Judge the retained history too, not only "
                                                                 "new events."),
) -> None:
    """Raise alerts (slow thinking, tool failure rate, lag) as events on agent.alerts and log lines."""
    from agentstream.services.alerts.app import run_alerts
    from agentstream.streams.config.settings import use_kafka_principal

    use_kafka_principal("alerts")
    run_alerts(loglevel=log_level, from_start=from_start)


@app.command()
def demo(
    task: str = typer.Option(None, help="The task (default: a sample arithmetic question)."),
    backend: str = typer.Option(None, help="scripted or llamacpp (default: llamacpp when installed)."),
) -> None:
    """Start the stack and the four services, run one task, show every step and event."""
    import logging

    from agentstream.demo import SAMPLE_TASK, pick_backend, run_demo
    from agentstream.devstack.stack import DevStack

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    with console.status("starting Kafka and PostgreSQL…"):
        DevStack().up()
    ok = run_async(run_demo(task or SAMPLE_TASK, pick_backend(backend), console))
    raise typer.Exit(0 if ok else 1)


# -- dead letters (streams/runtime/dead_letters.py) -----------------------------------------------------------------------
dlq = typer.Typer(help="Dead letters (agent.dlq): list them, show one, re-drive them to their source topic.",
                  no_args_is_help=True)
app.add_typer(dlq, name="dlq")


@dlq.callback()
def _dlq_principal() -> None:
    """On a secure stack, dead letters are the operator's (docs/security.md)."""
    from agentstream.streams.config.settings import use_kafka_principal

    use_kafka_principal("operator")

_KIND_HELP = "Only this error kind: undecodable, unknown_schema, invalid, handler_error, retries_exhausted."


@dlq.command("list")
def dlq_list(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
    kind: str = typer.Option(None, "--kind", help=_KIND_HELP),
    source_topic: str = typer.Option(None, "--source-topic", help="Only letters of records from this topic."),
    limit: int = typer.Option(50, "--limit", help="The most recent N matching letters (0: all)."),
) -> None:
    """Dead letters, oldest first: where each record came from, which service gave up on it and why."""

    from agentstream.streams.config.settings import Settings
    from agentstream.streams.runtime.dead_letters import DeadLetters, StoredLetter

    async def go() -> list[StoredLetter]:
        async with DeadLetters(Settings.load()) as letters:
            return await letters.list(kind=kind, source_topic=source_topic, limit=limit or None)

    letters = run_async(go())
    assert isinstance(letters, list)
    if as_json:
        print(json.dumps([s.summary() for s in letters]))
        return
    if not letters:
        console.print("no dead letters" + (" match" if kind or source_topic else ""))
        return
    table = Table("offset", "time (UTC)", "source", "consumer", "kind", "reason", "run", "value", "re-driven")
    for stored in letters:
        letter = stored.letter
        when = stored.timestamp.strftime("%Y-%m-%d %H:%M:%S")
        if letter is None:
            table.add_row(str(stored.offset), when, "", "", "?", escape(_short(stored.problem or "", 60)), "", "", "")
            continue
        size = "" if letter.value_size is None else f"{letter.value_size} B" + (" (cut)" if letter.truncated else "")
        table.add_row(str(stored.offset), when, escape(f"{letter.source_topic}[{letter.source_partition}]@"
                                                       f"{letter.source_offset}"),
                      escape(letter.consumer), letter.error_kind, escape(_short(letter.reason, 60)),
                      escape(letter.run_id), size, str(stored.redrives or ""))
    console.print(table)


@dlq.command("show")
def dlq_show(offset: int = typer.Argument(..., help="The letter's offset in the dead-letter topic."),
             as_json: bool = typer.Option(False, "--json", help="Print one JSON object.")) -> None:
    """Everything a letter holds, and the original event decoded when it decodes."""

    from agentstream.streams.config.settings import Settings
    from agentstream.streams.runtime.dead_letters import DeadLetters

    async def go() -> dict:
        async with DeadLetters(Settings.load()) as letters:
            return (await letters.show(offset)).as_dict()

    data = run_async(go())
    assert isinstance(data, dict)
    if as_json:
        print(json.dumps(data, default=str))
        return
    table = Table(show_header=False, box=None)
    skip = {"original", "value_base64", "headers", "redrive_history"}
    for name, value in data.items():
        if name not in skip and value is not None:
            table.add_row(f"[bold]{name}[/bold]", escape(str(value)))
    for name, value in (data.get("headers") or {}).items():
        table.add_row(f"[bold]header[/bold] {escape(name)}", escape(_short(value or "", 200)))
    for row in data["redrive_history"]:
        table.add_row("[bold]re-driven[/bold]", escape(f"{row['redriven_at']} by {row['redriven_by']}: {row['status']}"
                                                       f" → {row['source_topic']}[{row['source_partition']}]@"
                                                       f"{row['target_offset']}" + (" (forced)" if row["forced"] else "")))
    console.print(table)
    if data["original"] is not None:
        console.print(f"[bold]original {data['original_type']}[/bold]")
        console.print_json(data=data["original"], default=str)


@dlq.command("redrive")
def dlq_redrive(
    offsets: list[int] = typer.Argument(None, help="Offsets of the letters to re-drive."),
    every: bool = typer.Option(False, "--all", help="Every letter (narrowed by --kind and --source-topic)."),
    kind: str = typer.Option(None, "--kind", help=_KIND_HELP + " With --all."),
    source_topic: str = typer.Option(None, "--source-topic", help="Only letters from this topic. With --all."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would be re-driven; publish nothing."),
    force: bool = typer.Option(False, "--force", help="Re-drive letters that were re-driven before, again."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
) -> None:
    """Republish letters' original records to their source topic and partition (e.g. after a fix).

    Each copy has the original value, key and headers, plus agentstream-redrive naming the letter. A
    letter is re-driven once unless --force; a truncated letter's original is read back from its source
    topic while it is retained. Exits 1 when a letter was refused or its publish failed."""

    from agentstream.streams.config.settings import Settings
    from agentstream.streams.runtime.dead_letters import DeadLetters, RedriveResult

    if bool(offsets) == every:
        err.print("[red]error:[/red] name the letters' offsets, or --all (not both)")
        raise typer.Exit(2)
    if (kind or source_topic) and not every:
        err.print("[red]error:[/red] --kind and --source-topic choose letters for --all")
        raise typer.Exit(2)

    async def go() -> list[RedriveResult]:
        async with DeadLetters(Settings.load()) as letters:
            return await letters.redrive(offsets or (), every=every, kind=kind, source_topic=source_topic,
                                         dry_run=dry_run, force=force)

    results = run_async(go())
    assert isinstance(results, list)
    if as_json:
        print(json.dumps([r.as_dict() for r in results]))
    elif not results:
        console.print("no dead letters match")
    else:
        colours = {"redriven": "green", "would_redrive": "cyan", "skipped": "yellow"}
        table = Table("offset", "action", "detail")
        for r in results:
            colour = colours.get(r.action, "red")
            table.add_row(str(r.offset), f"[{colour}]{r.action}[/{colour}]", escape(r.detail))
        console.print(table)
    raise typer.Exit(0 if all(r.ok for r in results) else 1)


contract = typer.Typer(help="The contract for other languages: topics, keys, events, headers (docs/contract.md).",
                       no_args_is_help=True)
app.add_typer(contract, name="contract")


@contract.command("asyncapi")
def contract_asyncapi(
    out: str = typer.Option(None, "--out", help="Write the document to this file instead of printing it."),
) -> None:
    """The AsyncAPI 3.0 document of agentstream's topics, built from the code (JSON; docs/asyncapi.json is
    the committed copy: regenerate it with --out docs/asyncapi.json after changing topics or schemas)."""
    from pathlib import Path

    from agentstream.ops.asyncapi import build_document, render

    text = render(build_document())
    if out is None:
        sys.stdout.write(text)
        return
    Path(out).write_text(text)
    err.print(f"wrote {out}")


@app.command()
def migrate() -> None:
    """Create the topics and apply the SQL migrations, then exit (the deploy's migration Job; every worker
    does the same on start, under an advisory lock, so running it twice is harmless)."""
    import logging

    from agentstream.services.worker import prepare
    from agentstream.streams.config.settings import Settings, use_kafka_principal

    use_kafka_principal("admin")  # creates topics; on the local secure stack: the administrator and the owner

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_async(prepare(Settings.load()))
    console.print("topics and migrations are in place")


@app.command()
def acls(
    apply: bool = typer.Option(False, "--apply", help="Create them on the cluster, as the configured principal "
                                                      "(the cluster's administrator: AGENTSTREAM_KAFKA_USERNAME ...)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON array."),
) -> None:
    """The Kafka ACLs each principal needs under the configured topic prefix (docs/security.md), derived
    from the topic contract; `--apply` creates them (idempotent). `dev up --secure` applies them itself."""
    import json

    from agentstream.ops.acls import acl_bindings, apply_acls
    from agentstream.streams.config.settings import Settings
    from agentstream.streams.kafka.topics import Topics

    settings = Settings.load()
    bindings = acl_bindings(Topics.of(settings))
    if as_json:
        print(json.dumps([{"principal": f"User:{b.principal}", "operation": b.operation.name,
                           "resource": b.resource.name, "name": b.name, "pattern": b.pattern.name}
                          for b in bindings], indent=2))
    else:
        table = Table("principal", "operation", "resource", "name")
        for b in bindings:
            table.add_row(b.principal, b.operation.name, b.resource.name.lower(),
                          escape(b.name + ("*" if b.pattern.name == "PREFIXED" else "")))
        console.print(table)
    if apply:
        count = run_async(apply_acls(settings.kafka_bootstrap, settings.kafka_auth, bindings))
        err.print(f"created {count} ACLs as {escape(settings.kafka_auth.principal)}")


deploy = typer.Typer(help="Kubernetes manifests for the consumer services (docs/deploy.md).", no_args_is_help=True)
app.add_typer(deploy, name="deploy")


@deploy.command("render")
def deploy_render(
    values: list[str] = typer.Option(None, "--values", "-f", help="A values file over the defaults "
                                                                  "(repeatable; later files win)."),
    set_: list[str] = typer.Option(None, "--set", help="KEY.PATH=VALUE over the files, e.g. "
                                                       "services.tools.replicas=3 (repeatable)."),
    out: str = typer.Option(None, "--out", help="Write a kustomize base (one file per object and a "
                                                "kustomization.yaml) to this directory instead of printing."),
    show_values: bool = typer.Option(False, "--show-values", help="Print the merged values instead."),
) -> None:
    """The manifests of every enabled service (ConfigMap, Secret, migration Job, Deployments,
    PodDisruptionBudgets, KEDA ScaledObjects, NetworkPolicy) from infra/deploy/values.yaml and yours."""
    from pathlib import Path

    from agentstream.deploy import manifests, render
    from agentstream.deploy import values as deploy_values

    merged = deploy_values.load([Path(v) for v in values or []], set_ or [])
    if show_values:
        sys.stdout.write(render.to_yaml([merged]))
        return
    objects = manifests.render(merged)
    if out is None:
        sys.stdout.write(render.to_yaml(objects))
        return
    written = render.write_base(objects, Path(out))
    err.print(f"wrote {len(written)} files to {out}")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop (faster on the hot path) unless AGENTSTREAM_UVLOOP=0 or it is not
    installed (it comes with the [worker] extra; a client's commands run as well on asyncio's loop)."""
    import asyncio

    from agentstream.streams.config.settings import uvloop_enabled

    if uvloop_enabled():
        try:
            import uvloop
        except ModuleNotFoundError:
            return asyncio.run(coro)
        return uvloop.run(coro)
    return asyncio.run(coro)


def _yes(flag: bool) -> str:
    return "[green]yes[/green]" if flag else "[red]no[/red]"


def main() -> None:
    """Console-script entry: known errors print one clear line (no traceback) and exit 2."""
    try:
        app()
    except AgentStreamError as exc:
        err.print(f"[red]error:[/red] {escape(str(exc))}", soft_wrap=True)
        sys.exit(2)
    except ModuleNotFoundError as exc:  # a command whose extra is not installed: say which one
        missing = missing_extra(exc, f"agentstream {' '.join(sys.argv[1:3])}".strip())
        if missing is None:
            raise
        err.print(f"[red]error:[/red] {escape(str(missing))}", soft_wrap=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
