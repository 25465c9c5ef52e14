"""The gateway's own settings: ``GatewaySettings``, from ``AGENTSTREAM_GATEWAY_*`` (docs/gateway.md, "Settings").

Kept apart from ``Settings`` (the pipeline's: broker, database, topics), which the gateway loads like every
other process: these are about the HTTP door only, so a worker never reads them and a gateway replica
needs nothing else. Every limit is per replica: the gateway keeps no shared state, so N replicas behind a
load balancer admit up to N times as much (divide the rate by the replica count to cap a tenant overall).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agentstream.streams.config import env
from agentstream.streams.core.errors import ConfigError

DEFAULT_TENANT = "default"


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    """What one gateway replica accepts and how it serves it. ``load()`` reads the environment."""

    #: Where uvicorn listens (``agentstream worker gateway --host/--port`` win over these).
    host: str = "127.0.0.1"
    port: int = 8080
    #: A tenant's requests per second (token bucket refill) and the bucket's size (a burst).
    rate_per_s: float = 50.0
    burst: int = 100
    #: Requests being served at once (SSE streams not counted); beyond: 503 with Retry-After.
    max_in_flight: int = 256
    #: Open SSE streams (``/v1/runs/{id}/events`` and streamed chat completions); beyond: 503.
    max_streams: int = 2000
    #: Events waiting for one slow SSE reader; a reader further behind is dropped (it resumes with
    #: Last-Event-ID, losing nothing) so that it never holds up the others.
    stream_queue: int = 1024
    #: Seconds between SSE comment lines on a quiet stream (keeps proxies from closing it).
    keepalive_s: float = 15.0
    #: The largest request body, in bytes (413 beyond).
    max_body_bytes: int = 1024 * 1024
    #: How long a verified token is trusted without asking PostgreSQL again (a revocation takes at most
    #: this long to reach every replica).
    auth_cache_s: float = 30.0
    #: The names ``model`` (chat completions) and ``agent`` (runs) may take. Until agent definitions exist,
    #: each is the pipeline's default agent: every registered tool, the default limits.
    agents: tuple[str, ...] = ("agentstream",)
    #: The tenant whose cell is the gateway's own topic prefix (``AGENTSTREAM_TOPIC_PREFIX``, usually
    #: empty); any other tenant T is the cell ``T.`` (docs/security.md, "Tenants").
    default_tenant: str = DEFAULT_TENANT
    #: A chat completion's run: its step budget and its deadline (seconds), as a task would give them.
    chat_max_steps: int = 8
    chat_deadline_s: float = 120.0
    #: How long a read of a run that PostgreSQL does not know yet waits for it (a run just submitted,
    #: through another replica perhaps, that its planner has not recorded yet) before answering 404.
    unknown_run_wait_s: float = 2.0
    #: Recent events the live fan-out keeps per cell (a new or resumed stream starts from them instead of
    #: opening a Kafka consumer of its own), and for how long after their run's last event.
    history_events: int = 200_000
    history_s: float = 300.0

    @classmethod
    def load(cls) -> GatewaySettings:
        agents = tuple(a.strip() for a in os.environ.get("AGENTSTREAM_GATEWAY_AGENTS", "").split(",") if a.strip())
        default_tenant = os.environ.get("AGENTSTREAM_GATEWAY_DEFAULT_TENANT", "").strip() or DEFAULT_TENANT
        if not tenant_name_ok(default_tenant):
            raise ConfigError(f"AGENTSTREAM_GATEWAY_DEFAULT_TENANT={default_tenant!r}: lower-case letters, digits "
                              "and '-' only")
        port = env.non_negative_int("AGENTSTREAM_GATEWAY_PORT", 8080)
        if port > 65535:
            raise ConfigError(f"AGENTSTREAM_GATEWAY_PORT={port} must be at most 65535")
        return cls(
            host=os.environ.get("AGENTSTREAM_GATEWAY_HOST", "").strip() or "127.0.0.1",
            port=port,
            rate_per_s=env.positive_float("AGENTSTREAM_GATEWAY_RATE_PER_S", 50.0),
            burst=env.positive_int("AGENTSTREAM_GATEWAY_BURST", 100),
            max_in_flight=env.positive_int("AGENTSTREAM_GATEWAY_MAX_IN_FLIGHT", 256),
            max_streams=env.positive_int("AGENTSTREAM_GATEWAY_MAX_STREAMS", 2000),
            stream_queue=env.positive_int("AGENTSTREAM_GATEWAY_STREAM_QUEUE", 1024),
            keepalive_s=env.positive_float("AGENTSTREAM_GATEWAY_KEEPALIVE_S", 15.0),
            max_body_bytes=env.positive_int("AGENTSTREAM_GATEWAY_MAX_BODY_BYTES", 1024 * 1024),
            auth_cache_s=env.positive_float("AGENTSTREAM_GATEWAY_AUTH_CACHE_S", 30.0),
            agents=agents or ("agentstream",),
            default_tenant=default_tenant,
            chat_max_steps=env.positive_int("AGENTSTREAM_GATEWAY_CHAT_MAX_STEPS", 8),
            chat_deadline_s=env.positive_float("AGENTSTREAM_GATEWAY_CHAT_DEADLINE_S", 120.0),
            unknown_run_wait_s=env.positive_float("AGENTSTREAM_GATEWAY_UNKNOWN_RUN_WAIT_S", 2.0),
            history_events=env.positive_int("AGENTSTREAM_GATEWAY_HISTORY_EVENTS", 200_000),
            history_s=env.positive_float("AGENTSTREAM_GATEWAY_HISTORY_S", 300.0),
        )


def tenant_name_ok(tenant: str) -> bool:
    """A tenant name as ``agentstream dev up --tenant`` takes one: it becomes a topic prefix and a login."""
    return bool(tenant) and len(tenant) <= 64 and tenant.replace("-", "").isalnum() and tenant.isascii() \
        and tenant == tenant.lower()


__all__ = ["DEFAULT_TENANT", "GatewaySettings", "tenant_name_ok"]
