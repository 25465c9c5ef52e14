"""What one gateway replica holds while it runs (``Gateway``), and the run id an ``Idempotency-Key`` names.

Nothing here is shared between replicas, and nothing needs to be: runs are in Kafka and PostgreSQL, a
token is verified against PostgreSQL, and an idempotency key is turned into a run id by a hash, so a
retry that reaches another replica names the same run without asking anyone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from agentstream.services.gateway.auth import Authenticator, Verify
from agentstream.services.gateway.cells import Cells
from agentstream.services.gateway.limits import RateLimiter, Slots
from agentstream.services.gateway.metrics import GatewayMetrics
from agentstream.services.gateway.problems import Problem
from agentstream.services.gateway.settings import GatewaySettings
from agentstream.services.gateway.tokens import Principal, verify
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topics import Topics

MAX_KEY_CHARS = 255


@dataclass
class Gateway:
    """A replica's state: the pipeline's settings, its own, the cells it serves, and its limits."""

    settings: Settings
    config: GatewaySettings
    cells: Cells
    auth: Authenticator
    limiter: RateLimiter
    in_flight: Slots
    streams: Slots
    metrics: GatewayMetrics

    @classmethod
    def build(cls, settings: Settings, config: GatewaySettings, *, verifier: Verify | None = None) -> Gateway:
        """``verifier``: how a token becomes a principal (default: PostgreSQL; unit tests pass their own)."""
        in_flight, streams = Slots(config.max_in_flight, "requests"), Slots(config.max_streams, "streams")
        metrics = GatewayMetrics(streams_open=lambda: streams.used, in_flight=lambda: in_flight.used)
        cells = Cells(settings, config, metrics)

        async def from_database(token: str) -> Principal | None:
            return await verify(await cells.pool(), token)

        return cls(settings=settings, config=config, cells=cells,
                   auth=Authenticator(verifier or from_database, config.auth_cache_s),
                   limiter=RateLimiter(config.rate_per_s, config.burst), in_flight=in_flight, streams=streams,
                   metrics=metrics)

    async def close(self) -> None:
        await self.cells.close()


async def gateway_of(request: Request) -> Gateway:
    """The replica's state. ``async`` on purpose: FastAPI runs a plain ``def`` dependency in a worker thread,
    a thread hop (~0.1-0.3 ms on a busy machine) on every request."""
    gateway: Gateway = request.app.state.gateway
    return gateway


GatewayDep = Annotated[Gateway, Depends(gateway_of)]


def idempotency_key(raw: str | None) -> str | None:
    """The ``Idempotency-Key`` header, checked: 1 to 255 visible ASCII characters (400 otherwise)."""
    if raw is None:
        return None
    if not 0 < len(raw) <= MAX_KEY_CHARS or not all(32 <= ord(c) < 127 for c in raw):
        raise Problem(400, f"the Idempotency-Key must be 1 to {MAX_KEY_CHARS} visible ASCII characters",
                      slug="bad-idempotency-key")
    return raw


def run_id_for_key(topics: Topics, tenant: str, key: str, session: str | None = None) -> str:
    """The run id an idempotency key names, for a tenant: the same key gives the same run, on every
    replica, and two tenants' keys never meet. A turn of a session must be on the session's partition
    (``Topics.run_id_for_session``), so for one the hash is drawn again, deterministically, until it is."""
    wanted = topics.partition_for(session) if session is not None else None
    for attempt in range(10_000):
        digest = hashlib.sha256(f"agentstream-gateway\0{tenant}\0{key}\0{attempt}".encode()).hexdigest()
        run_id = f"run-{digest[:16]}"
        if wanted is None or topics.partition_for(run_id) == wanted:
            return run_id
    raise Problem(500, "no run id on the session's partition")  # (1 in e^1250 with 8 partitions)


__all__ = ["Gateway", "GatewayDep", "gateway_of", "idempotency_key", "run_id_for_key"]
