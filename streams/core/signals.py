"""What a handler raises to steer the consumer runtime: not errors, and deliberately outside the
``AgentStreamError`` tree that users are told to catch.

``Deferred`` puts a record aside until it can be handled; ``Abandoned`` (and the planner's ``Fenced``)
leaves it uncommitted because this process no longer owns its partition. The runtime catches each
before it looks at errors, so neither is ever retried, dead-lettered or shown to a user.
"""

from __future__ import annotations

import asyncio


class Signal(Exception):
    """Root of the runtime's flow-control signals."""


class Abandoned(Signal):
    """This process must not finish the record it is handling: it no longer owns the record's partition
    (another member took it over after a pause or a network cut). The runtime leaves the record
    uncommitted and unacknowledged; the partition's new owner handles it."""


class Deferred(Signal):
    """A handler cannot handle this record yet: what it answers is still to be redone from another
    record (the planner: a result for a step whose request was published while the transition that
    asked for it was being recorded, when that planner died before the record was). The runtime puts it
    aside — not done, so its offset is not committed past — lets the key's next records through, and
    hands it over again once ``ready`` resolves or ``timeout_s`` passed (``Record.deferrals`` counts)."""

    def __init__(self, reason: str, *, ready: asyncio.Future[None] | None = None, timeout_s: float = 30.0) -> None:
        super().__init__(reason)
        self.ready = ready
        self.timeout_s = timeout_s


class Fenced(Abandoned):
    """The planner's lease on the run's partition is no longer current: another planner owns it now."""
