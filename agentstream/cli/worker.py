"""``agentstream worker``, ``alerts`` and ``migrate``: the processes a deployment runs (the services, the
alerting app, and the migration that prepares what they need)."""

from __future__ import annotations

import typer

from agentstream.cli.common import console, run_async


def worker(
    service: str = typer.Argument(..., help="planner, inference, retrieval, tools, or all; or gateway (the "
                                            "HTTP gateway, never part of all: docs/gateway.md)"),
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
    mcp: list[str] = typer.Option(None, "--mcp", metavar="NAME=stdio:CMD|NAME=URL",
                                  help="Serve an MCP server's tools as NAME__TOOL (repeatable; default: "
                                       "AGENTSTREAM_MCP_SERVERS; docs/mcp.md)."),
    mcp_approve: list[str] = typer.Option(None, "--mcp-approve", metavar="PATTERN",
                                          help="MCP tools (e.g. 'files__*') whose calls a person approves."),
    mcp_idempotent: list[str] = typer.Option(None, "--mcp-idempotent", metavar="PATTERN",
                                             help="MCP tools that may run twice for one step (no claim; retried)."),
    mcp_timeout: float = typer.Option(None, "--mcp-timeout", help="Seconds an MCP tool call may take (default: "
                                                                  "AGENTSTREAM_MCP_TIMEOUT_S, else 30)."),
    log_level: str = typer.Option("INFO", help="Python log level."),
    metrics_port: int = typer.Option(None, help="Serve /metrics, /healthz, /readyz on this port (0: any free "
                                                "port; default: AGENTSTREAM_METRICS_PORT, else off)."),
    host: str = typer.Option(None, "--host", help="gateway: the address to listen on (default: "
                                                  "AGENTSTREAM_GATEWAY_HOST, else 127.0.0.1)."),
    port: int = typer.Option(None, "--port", help="gateway: the port (default: AGENTSTREAM_GATEWAY_PORT, else 8080)."),
) -> None:
    """Run one service (or all four) until interrupted."""
    import dataclasses
    import logging

    if service == "gateway":  # a client of the pipeline, not a consumer service: never part of `all`
        _gateway(host, port, log_level)
        return

    from agentstream.services.tools.builtin import BuiltinConfig
    from agentstream.services.tools.http import HttpGetConfig
    from agentstream.services.worker import SERVICES, WorkerOptions, check_services, serve
    from agentstream.streams.config.env import model_api_key, tool_environment
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings
    from agentstream.streams.config.trtllm import TrtLlmSettings

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
                            mcp_servers=_mcp_servers(mcp, mcp_approve, mcp_idempotent, mcp_timeout),
                            tool_modules=tuple(tools_module) if tools_module else ("agentstream.services.tools.builtin",),
                            metrics_port=metrics_port)
    check_services(names)
    # On a secure stack, each service is its own principal; all four together are the worker.
    settings = Settings.load(identity=Identity(principal="worker" if service == "all" else service))
    run_async(serve(names, options, settings))


def _mcp_servers(specs: list[str] | None, approve: list[str] | None, idempotent: list[str] | None,
                 timeout_s: float | None) -> list:
    """The MCP servers of ``--mcp`` (else ``AGENTSTREAM_MCP_SERVERS``) with their rules; the ``mcp`` extra
    is needed only when there are some."""
    from agentstream.streams.config.env import tool_environment

    environ = tool_environment()
    if not specs and not environ.get("AGENTSTREAM_MCP_SERVERS", "").strip():
        return []
    from agentstream.services.tools.mcp.config import McpSettings

    settings = McpSettings.from_env(environ).with_options(specs=specs, timeout_s=timeout_s,
                                                          requires_approval=approve, idempotent=idempotent)
    return settings.servers()


def _gateway(host: str | None, port: int | None, log_level: str) -> None:
    """``agentstream worker gateway``: the HTTP gateway (services/gateway/), on the secure stack as its own
    principal (``gateway``)."""
    import dataclasses
    import logging

    from agentstream.services.gateway.server import serve
    from agentstream.services.gateway.settings import GatewaySettings
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = GatewaySettings.load()
    config = dataclasses.replace(config, host=host or config.host, port=config.port if port is None else port)
    run_async(serve(Settings.load(identity=Identity(principal="gateway")), config))


def alerts(
    log_level: str = typer.Option("info", help="faust worker log level."),
    from_start: bool = typer.Option(False, "--from-start", help="Judge the retained history too, not only "
                                                                 "new events."),
) -> None:
    """Raise alerts (slow thinking, tool failure rate, lag) as events on agent.alerts and log lines."""
    from agentstream.services.alerts.app import run_alerts
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    run_alerts(Settings.load(identity=Identity(principal="alerts")), loglevel=log_level, from_start=from_start)


def migrate() -> None:
    """Create the topics and apply the SQL migrations, then exit (the deploy's migration Job; every worker
    does the same on start, under an advisory lock, so running it twice is harmless)."""
    import logging

    from agentstream.services.worker import prepare
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Creates topics; on the local secure stack: the administrator (and the schema owner's login).
    run_async(prepare(Settings.load(identity=Identity(principal="admin"))))
    console.print("topics and migrations are in place")
