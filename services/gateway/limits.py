"""What one gateway replica admits: a rate per tenant, requests and streams at once, and body size.

Each limit answers before any work is done, with a problem (services/gateway/problems.py) that says when
to come back: 429 with ``Retry-After`` for a tenant over its rate (the others are not slowed), 503 with
``Retry-After`` for a replica at its bound of requests or streams (a load balancer sends the retry
elsewhere), 413 for a body over the limit, counted as it arrives (a missing or lying Content-Length
changes nothing). All of it is in memory: replicas share nothing, so the limits are per replica.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentstream.services.gateway.problems import Problem, problem_response


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up. ``take`` spends one, or says how many seconds
    until one is there."""

    rate: float
    burst: float
    tokens: float = -1.0
    stamp: float = 0.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        if self.tokens < 0:
            self.tokens = self.burst
        self.stamp = self.clock()

    def take(self) -> float:
        """0.0 when a token was taken; otherwise the seconds to wait for the next one (nothing is taken)."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RateLimiter:
    """One ``TokenBucket`` per tenant. Buckets of tenants idle long enough to be full again are dropped, so
    the map stays as small as the set of active tenants."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self.buckets: dict[str, TokenBucket] = {}
        self._swept = clock()

    def check(self, tenant: str) -> None:
        """Raise a 429 problem when ``tenant`` is over its rate."""
        bucket = self.buckets.get(tenant)
        if bucket is None:
            bucket = self.buckets[tenant] = TokenBucket(self.rate, self.burst, clock=self.clock)
        wait = bucket.take()
        self._sweep()
        if wait > 0:
            raise Problem(429, f"tenant {tenant!r} is over its rate of {self.rate:g} requests/s (burst {self.burst}); "
                               f"retry in {wait:.2f} s", headers={"Retry-After": str(max(1, math.ceil(wait)))})

    def _sweep(self) -> None:
        now = self.clock()
        full_after = self.burst / self.rate
        if now - self._swept < max(full_after, 1.0):
            return
        self._swept = now
        for tenant in [t for t, b in self.buckets.items() if now - b.stamp > full_after]:
            del self.buckets[tenant]


class Slots:
    """At most ``limit`` of something at once (requests being served, open streams). ``acquire`` raises a
    503 problem at the limit instead of queueing: a queue here would only hold the client longer while the
    replica is already busy; another replica may not be."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.used = 0

    def acquire(self) -> None:
        if self.used >= self.limit:
            raise Problem(503, f"this gateway replica serves {self.limit} {self.what} at once; retry shortly",
                          headers={"Retry-After": "1"}, slug="busy")
        self.used += 1

    def release(self) -> None:
        self.used -= 1


class BodyLimit:
    """ASGI middleware: a request whose body is over ``limit`` bytes gets 413, whether its Content-Length
    says so up front or the bytes only turn out to be too many as they arrive."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = Problem(413, f"the request body is over {self.limit} bytes")
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > self.limit:
                    await problem_response(None, too_large)(scope, receive, send)
                    return
        seen = 0
        over = replied = False

        async def counted() -> Message:
            # Past the limit the app hears a disconnect: it stops reading, and its answer is replaced below.
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def reply_413() -> None:
            nonlocal replied
            if not replied:
                replied = True
                await problem_response(None, too_large)(scope, receive, send)

        async def watched(message: Message) -> None:
            if over:
                await reply_413()  # whatever the app made of the cut-off body, the client hears 413
                return
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            if not over:
                raise
        if over:
            await reply_413()


__all__ = ["BodyLimit", "RateLimiter", "Slots", "TokenBucket"]
