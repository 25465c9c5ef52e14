"""Who is asking: the bearer token, checked against PostgreSQL (services/gateway/tokens.py), and what its
role allows. The principal of every request is the token's tenant and role; nothing in the request's
body or query can change it (an approval is recorded as the token's, never as a name the body gives).

A verified token is trusted for ``auth_cache_s`` without asking the database again, so a request costs no
query; a revoked token stops working on every replica within that time. The cache is keyed by the
token's hash, so the process never keeps a token it was sent.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from agentstream.services.gateway.problems import Problem
from agentstream.services.gateway.tokens import Principal, Role

Verify = Callable[[str], Awaitable[Principal | None]]

#: The OpenAPI document's security scheme; ``auto_error=False``: a missing token is our 401, as problem+json.
bearer = HTTPBearer(auto_error=False, scheme_name="bearer",
                    description="A token from `agentstream token create --tenant T --role submitter|approver|operator|reader`.")
_CHALLENGE = 'Bearer realm="agentstream"'


class Authenticator:
    """Tokens to principals, with a short cache (see the module docstring)."""

    def __init__(self, verify: Verify, cache_s: float, clock: Callable[[], float] = time.monotonic,
                 max_entries: int = 10_000) -> None:
        self.verify = verify
        self.cache_s = cache_s
        self.clock = clock
        self.max_entries = max_entries
        self.cache: dict[str, tuple[Principal, float]] = {}

    async def principal(self, token: str) -> Principal | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        hit = self.cache.get(key)
        if hit is not None and hit[1] > now:
            return hit[0]
        principal = await self.verify(token)
        if principal is None:
            self.cache.pop(key, None)
            return None
        if len(self.cache) >= self.max_entries:
            self.cache = {k: v for k, v in self.cache.items() if v[1] > now}
            if len(self.cache) >= self.max_entries:
                self.cache.clear()
        self.cache[key] = (principal, now + self.cache_s)
        return principal


def require(role: Role) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the request's principal, if its token is valid (else 401), allows ``role`` (else 403)
    and its tenant is within its rate (else 429)."""

    async def principal(request: Request,
                        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Principal:
        gateway = request.app.state.gateway
        if credentials is None or not credentials.credentials:
            raise Problem(401, "a bearer token is required (Authorization: Bearer ags_...)",
                          headers={"WWW-Authenticate": _CHALLENGE})
        found = await gateway.auth.principal(credentials.credentials)
        if found is None:
            raise Problem(401, "the bearer token is not valid (unknown, malformed or revoked)",
                          headers={"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'})
        if not found.may(role):
            raise Problem(403, f"a {found.role.value} token may not do this; it needs a {role.value} token",
                          slug="forbidden")
        gateway.limiter.check(found.tenant)
        return found

    return principal


Reader = Annotated[Principal, Depends(require(Role.READER))]
Approver = Annotated[Principal, Depends(require(Role.APPROVER))]
Submitter = Annotated[Principal, Depends(require(Role.SUBMITTER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]

__all__ = ["Approver", "Authenticator", "Operator", "Reader", "Submitter", "Verify", "bearer", "require"]
