"""``agentstream worker gateway``: serve the gateway with uvicorn until interrupted.

One process, one event loop (uvloop where the worker extra installs it), no reload, no workers of
uvicorn's own: scale by running more replicas behind a load balancer (they share nothing). uvicorn's
access log is off (a line per token stream reconnect is noise); the gateway logs what goes wrong.
"""

from __future__ import annotations

import logging

import uvicorn

from agentstream.services.gateway.app import create_app
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.streams.config.settings import Settings

log = logging.getLogger(__name__)


def server(settings: Settings, config: GatewaySettings) -> uvicorn.Server:
    app = create_app(settings, config)
    return uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, access_log=False,
                                         log_level=logging.getLevelName(logging.getLogger().level).lower(),
                                         lifespan="on", timeout_graceful_shutdown=5, loop="none",
                                         backlog=4096, limit_concurrency=None))


async def serve(settings: Settings, config: GatewaySettings) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn handles them)."""
    srv = server(settings, config)
    log.info("gateway on http://%s:%d (cell prefix %r for tenant %r)", config.host, config.port,
             settings.topic_prefix, config.default_tenant)
    await srv.serve()


__all__ = ["serve", "server"]
