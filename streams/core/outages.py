"""Telling an outage from a bad record.

A record whose handler fails because PostgreSQL, the broker or the model server is down or overloaded
is not bad: the same record succeeds once the dependency is back. Dead-lettering it after a few quick
retries (what a generic retry policy does) strands the run for good, so the runtime waits outages out:
it pauses the record's partition and retries with capped backoff for as long as the outage lasts.
Only bad input, bugs, and failures that persist while the dependency answers go to the dead-letter
topic.

Which dependency an error belongs to is decided here, in one place: an error may say so itself (a
``dependency`` attribute, e.g. ``BackendError`` for the model server), else the driver's exception
types tell (asyncpg's connection, shutdown and capacity errors; aiokafka's retriable errors).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import asyncpg
from aiokafka.errors import KafkaError, KafkaTimeoutError

log = logging.getLogger(__name__)
T = TypeVar("T")

DATABASE = "database"
KAFKA = "kafka"
MODEL = "model"

#: asyncpg errors that say "the server is not there, not accepting, or out of room" — never "your
#: statement is wrong". QueryCanceledError (a statement timeout) is left out: a query that is too slow
#: is a problem of the query, and stays a bounded retry.
_DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,  # connection lost, refused during the startup packet, …
    asyncpg.exceptions.CannotConnectNowError,  # starting up, shutting down, in recovery
    asyncpg.exceptions.AdminShutdownError,
    asyncpg.exceptions.CrashShutdownError,
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full, out of memory
    asyncpg.InterfaceError,  # "connection is closed", "pool is closing"
    # A pooled connection cut off mid-query (the server went away) can come back in a state the driver
    # cannot use ("cannot switch to state 11; another operation is in progress"): the database probe
    # replaces the pool's connections (services/worker.py).
    asyncpg.exceptions.InternalClientError,
    ConnectionError,  # refused / reset before asyncpg wraps it (OSError subclasses)
    TimeoutError,  # a connect or pool acquire that got no answer (packets dropped, server hung)
)
_NETWORK_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ETIMEDOUT, errno.EHOSTDOWN})


def outage_of(exc: BaseException) -> str | None:
    """The dependency whose outage ``exc`` shows (``database``, ``kafka``, ``model``, …), or None when
    the error is not an outage (bad input, a bug, a conflict worth a bounded retry)."""
    declared = getattr(exc, "dependency", None)
    if isinstance(declared, str) and declared:
        return declared
    if isinstance(exc, asyncpg.exceptions.QueryCanceledError):
        return None
    if isinstance(exc, _DATABASE_ERRORS):
        return DATABASE
    if isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS:  # a connect to an unreachable host
        return DATABASE
    if isinstance(exc, KafkaTimeoutError) or (isinstance(exc, KafkaError) and exc.retriable):
        return KAFKA  # KafkaTimeoutError: a record not delivered in time (the broker is down)
    return None


def backoff(attempt: int, *, base_s: float, cap_s: float) -> float:
    """Seconds to wait before try ``attempt + 1``: doubling from ``base_s``, capped at ``cap_s``, with
    jitter (half to all of it) so that many waiters do not retry in step. The one backoff of the project."""
    return min(cap_s, base_s * 2.0 ** min(attempt - 1, 32)) * (0.5 + random.random() / 2)


async def wait_out(call: Callable[[], Awaitable[T]], what: str, *, cap_s: float = 5.0) -> T:
    """``await call()``, retried with capped exponential backoff for as long as it fails with an
    outage (anything else is raised): for work outside any record — starting a worker, taking a
    partition over, publishing a timer's outputs — which no redelivery would repeat."""
    failures = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            dependency = outage_of(exc)
            if dependency is None:
                raise
            log.warning("%s waits for %s (%s: %s)", what, dependency, type(exc).__name__, exc)
        failures += 1
        await asyncio.sleep(backoff(failures, base_s=0.1, cap_s=cap_s))


@dataclass
class Outage:
    dependency: str
    reason: str
    since: float = field(default_factory=time.time)
    #: Records waiting for the dependency now.
    waiting: int = 0


class Outages:
    """The outages a service is waiting out, for readiness (``/readyz``) and logs."""

    def __init__(self) -> None:
        self._current: dict[str, Outage] = {}

    def begin(self, dependency: str, exc: BaseException) -> Outage:
        outage = self._current.get(dependency)
        if outage is None:
            outage = self._current[dependency] = Outage(dependency, f"{type(exc).__name__}: {exc}"[:300])
        outage.waiting += 1
        return outage

    def end(self, outage: Outage) -> None:
        outage.waiting -= 1
        if outage.waiting <= 0 and self._current.get(outage.dependency) is outage:
            del self._current[outage.dependency]

    def __bool__(self) -> bool:
        return bool(self._current)

    def describe(self) -> str:
        """``"database unreachable for 12 s (ConnectionRefusedError: …), 40 records waiting"``."""
        now = time.time()
        return "; ".join(f"{o.dependency} unavailable for {now - o.since:.0f} s ({o.reason}), "
                         f"{o.waiting} record{'s' if o.waiting != 1 else ''} waiting"
                         for o in self._current.values())


__all__ = ["DATABASE", "KAFKA", "MODEL", "Outage", "Outages", "backoff", "outage_of", "wait_out"]
