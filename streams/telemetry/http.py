"""``/metrics``, ``/healthz`` and ``/readyz`` of a worker process (aiohttp, on the worker's event loop).

- ``/healthz``: 200 while the process serves HTTP at all (a liveness probe: restart it when this fails);
- ``/readyz``: 200 only once the worker can serve — its model is loaded or its database reachable
  (``Worker.start`` finished) *and* every service's consumer has joined its group and been assigned
  partitions — else 503 with the reason (a readiness probe; KEDA and rollouts wait on it);
- ``/metrics``: the Prometheus text format of the worker's registry.

The server starts before the model loads, so a probe sees "not ready" rather than a refused connection.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

Readiness = Callable[[], tuple[bool, str]]


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, readiness: Readiness, *, host: str = "127.0.0.1",
                 port: int = 0, advertise: str | None = None) -> None:
        self.registry = registry
        self.readiness = readiness
        self.host = host
        self.port = port
        self.advertise = advertise
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._health)
        app.router.add_get("/readyz", self._ready)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        addresses = self._runner.addresses  # the bound port, when 0 asked for any free one
        if addresses:
            self.port = addresses[0][1]
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        """Where other processes reach ``/metrics`` (the advertised host, else this host's name)."""
        host = self.advertise or (self.host if self.host not in ("0.0.0.0", "::", "") else socket.gethostname())
        return f"http://{host}:{self.port}/metrics"

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _ready(self, _request: web.Request) -> web.Response:
        ready, reason = self.readiness()
        return web.Response(status=200 if ready else 503, text=("ready" if ready else f"not ready: {reason}") + "\n")


__all__ = ["MetricsServer", "Readiness"]
