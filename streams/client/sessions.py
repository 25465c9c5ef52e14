"""A client's view of conversations (``AgentClient.sessions``): list, show and delete sessions.

    async with AgentClient() as client:
        first = await client.submit("My name is Ada.", session="chat-7")
        second = await client.submit("What is my name?", session="chat-7")  # runs after the first, sees it
        details = await client.sessions.show("chat-7")
        await client.sessions.delete("chat-7")

Reading goes to PostgreSQL (the transcript of record; ``agent.sessions`` mirrors it). Deleting erases the
transcript there and moves the session's epoch on in one statement (``agentstream_delete_session``, an
approver's login on a secure stack), tombstones the session on the compacted ``agent.sessions``, and asks
the session's turns that have not ended to stop: they fail with ``session_deleted``. A turn submitted
afterwards under the same id starts a new, empty session.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentstream.streams.core.errors import Unavailable
from agentstream.streams.core.outages import DATABASE, outage_of
from agentstream.streams.store import sessions as store
from agentstream.streams.store.sessions import SessionRow, TurnRef

if TYPE_CHECKING:
    from agentstream.streams.client.agent_client import AgentClient


@dataclass(frozen=True)
class SessionDetails:
    """A session's row (its transcript: ``row.turns``, oldest first) and its turns still going, in order."""

    row: SessionRow
    going: list[TurnRef]


class SessionsClient:
    """``AgentClient.sessions``: the conversations of the client's pipeline (its topic prefix)."""

    def __init__(self, client: AgentClient) -> None:
        self.client = client

    @property
    def prefix(self) -> str:
        return self.client.topics.prefix

    async def list(self, limit: int = 50) -> Sequence[SessionRow]:
        """The sessions, the most recently updated first (deleted ones without a turn since left out)."""
        with _database():
            return await store.listing(await self.client.pool(), self.prefix, limit=limit)

    async def show(self, session: str) -> SessionDetails | None:
        """The session's transcript and its turns still going (running or queued), or None if it never had
        a turn."""
        with _database():
            pool = await self.client.pool()
            row = await store.load(pool, self.prefix, session)
            if row is None:
                return None
            return SessionDetails(row=row, going=await store.active_turns(pool, self.prefix, session))

    async def delete(self, session: str) -> builtins.list[str] | None:
        """Erase the session (see the module's docstring); return the runs of its turns that were asked to
        stop, or None when there is no such session (nothing is published then)."""
        with _database():
            stopping = await store.delete(await self.client.pool(), self.prefix, session)
        if stopping is None:
            return None
        client = self.client
        await (await client.runtime.producer.send(client.topics.sessions, None, key=session.encode()))  # tombstone
        for run_id in stopping:
            await client.cancel(run_id, reason=f"the session {session!r} was deleted")
        return stopping


@contextmanager
def _database() -> Iterator[None]:
    """PostgreSQL being down is ``Unavailable`` to the caller, as for every other read of the client."""
    try:
        yield
    except Exception as exc:
        if outage_of(exc) == DATABASE:
            raise Unavailable(f"PostgreSQL is unavailable ({type(exc).__name__}: {exc}); try again later") from exc
        raise


__all__: Sequence[str] = ["SessionDetails", "SessionsClient"]
