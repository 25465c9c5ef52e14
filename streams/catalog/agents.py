"""Which agents exist: the compacted topic ``agent.agents``, written by ``agentstream agent register``
(``AgentClient.agents.register``), read by submit and the planner to resolve a task's ``agent``.

Modelled on the tool catalogue (streams/catalog/tools.py), with one difference: a task may name an
exact version (``support@2``), so readers keep **every** accepted version of each agent, and a bare name
means the highest. A registration is judged against the versions the catalogue holds for its name
(``judge``):

- a version not seen before and higher than every one there (or the agent's first) is taken;
- a version seen before with the same digest is the same registration (nothing to publish);
- a version seen before with another digest (a changed definition) is a *conflict*, refused;
- a version not seen before but lower than the highest is refused (no downgrade of "latest").

``register`` applies it before it publishes, with the batch's own checks (``batch_problems``: tools the
tool catalogue does not know, ``calls``/``handoffs`` naming agents that exist neither in the catalogue nor
in the batch, cycles of ``calls``), and publishes nothing unless the whole batch passes. Every reader
folds the topic with the same rule (``fold``), so a registration published anyway (a race between two
registrars: the first published stays) changes nothing. For that to survive compaction the record key
is ``{name}@{version}:{digest}``: compaction keeps every distinct registration, only identical ones
collapse.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from agentstream.streams.catalog.reader import CompactedCatalog
from agentstream.streams.catalog.tools import ToolCatalog
from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.core.agents import Agent, call_cycle, digest_of, parse_ref, resolve
from agentstream.streams.core.errors import AgentCatalogUnavailable, AgentRejected
from agentstream.streams.core.events import AgentRegistered
from agentstream.streams.kafka.codec import Codec

if TYPE_CHECKING:
    from agentstream.streams.runtime.publisher import Runtime

log = logging.getLogger(__name__)

#: The ``run_id`` of every registration: the envelope needs one, and a registration belongs to no run.
RUN_ID = "agents"

#: What a registration would do to the catalogue's versions of its agent (``judge``).
Judgement: TypeAlias = Literal["new", "newer", "same", "older", "conflict"]
ACCEPTED: frozenset[Judgement] = frozenset({"new", "newer"})
#: Versions by agent name, as the catalogue holds them.
Versions: TypeAlias = Mapping[str, Mapping[int, Agent]]


def registration(agent: Agent, *, by: str = "") -> AgentRegistered:
    """The event that registers ``agent``. Its id follows the definition (not who registers it), so the
    same registration republished is the same event."""
    return AgentRegistered.build(run_id=RUN_ID, step=f"{RUN_ID}:{agent.ref}", service="client", part=agent.digest,
                                 name=agent.name, version=agent.version, description=agent.description,
                                 definition=agent.definition_json(), digest=agent.digest, registered_by=by)


def registrar() -> str:
    """Who registers, by default: this host and process."""
    return f"{socket.gethostname()}:{os.getpid()}"


def digest(event: AgentRegistered) -> str:
    """The digest of what ``event`` says, computed (not the one it carries: a foreign producer may err)."""
    return digest_of(event.definition)


def record_key(event: AgentRegistered) -> str:
    """``{name}@{version}:{digest}``: one compacted slot per distinct registration."""
    return f"{event.name}@{event.version}:{digest(event)}"


def judge(candidate: AgentRegistered, stored: Mapping[int, AgentRegistered] | None) -> Judgement:
    """What ``candidate`` would do to ``stored``, the registered versions of the same agent."""
    if not stored:
        return "new"
    if candidate.version in stored:
        return "same" if digest(stored[candidate.version]) == digest(candidate) else "conflict"
    return "newer" if candidate.version > max(stored) else "older"


@dataclass(frozen=True)
class Refused:
    """A registration the catalogue did not take: ``older`` or ``conflict`` against the agent's versions."""

    event: AgentRegistered
    highest: AgentRegistered
    judgement: Judgement

    def describe(self) -> str:
        e, h = self.event, self.highest
        why = (f"its version {e.version} is lower than the catalogue's latest, {h.version}" if self.judgement == "older"
               else f"version {e.version} is already registered with another definition (digest "
                    f"{digest(h) if h.version == e.version else '?'}, not {digest(e)})")
        return (f"agent {e.name!r} version {e.version} refused: {why}; a changed definition needs a new version, "
                f"higher than {h.version}")


def fold(registrations: Iterable[AgentRegistered]) -> tuple[dict[str, dict[int, AgentRegistered]], list[Refused]]:
    """Every agent's accepted versions, folding ``registrations`` in the order they were published
    (``judge``), and the ones refused on the way."""
    versions: dict[str, dict[int, AgentRegistered]] = {}
    refused: list[Refused] = []
    for event in registrations:
        stored = versions.get(event.name)
        judgement = judge(event, stored)
        if judgement in ACCEPTED:
            versions.setdefault(event.name, {})[event.version] = event
        elif judgement != "same":
            assert stored is not None
            refused.append(Refused(event, stored.get(event.version) or stored[max(stored)], judgement))
    return versions, refused


def batch_problems(batch: Sequence[Agent], existing: Versions, tools: Iterable[str] | None) -> list[str]:
    """Why ``batch`` cannot be registered over the catalogue's ``existing`` versions: a changed definition
    under a registered version, a new version below the latest, a tool not in ``tools`` (None: not
    checked), a ``calls``/``handoffs`` reference to an agent (or version) neither registered nor in the
    batch, a cycle of ``calls``. Empty: it can."""
    problems: list[str] = []
    view: dict[str, dict[int, Agent]] = {name: dict(v) for name, v in existing.items()}
    for agent in sorted(batch, key=lambda a: (a.name, a.version)):
        known = view.get(agent.name, {})
        there = known.get(agent.version)
        if there is not None:
            if there.digest != agent.digest:
                what = "in this batch" if there in batch else "in the catalogue"
                problems.append(f"{agent.label}: version {agent.version} is already registered {what} with another "
                                f"definition (digest {there.digest}, not {agent.digest}); register the change as "
                                f"version {max(known) + 1}")
        elif known and agent.version < max(known):
            problems.append(f"{agent.label}: a new version must be higher than the latest, {max(known)}; "
                            f"its versions: {', '.join(str(v) for v in sorted(known))}")
        else:
            view.setdefault(agent.name, {})[agent.version] = agent
    if tools is not None:
        registered = set(tools)
        for agent in batch:
            unknown = [t for t in agent.tools if t not in registered]
            if unknown:
                problems.append(f"{agent.label}: unknown tool(s) {', '.join(unknown)}; registered tools: "
                                f"{', '.join(sorted(registered)) or 'none (is a tool worker running?)'}")
    for agent in batch:
        for what, refs in (("calls", agent.calls), ("hands off to", agent.handoffs)):
            for ref in refs:
                try:
                    resolve(ref, view)
                except AgentRejected as exc:
                    problems.append(f"{agent.label} {what} {ref!r}: {exc}")
    graph = {a.ref: _callees(a, view) for versions in view.values() for a in versions.values()}
    cycle = call_cycle(graph, [a.ref for a in batch if a.ref in graph])
    if cycle:
        problems.append(f"the agents would call each other in a cycle: {' → '.join(cycle)} (a sub-agent may not "
                        "call, directly or not, the agent that called it)")
    return problems


def _callees(agent: Agent, view: Versions) -> list[str]:
    """The exact definitions ``agent`` calls in ``view`` (a bare name: the latest there)."""
    out = []
    for ref in agent.calls:
        try:
            out.append(resolve(ref, view).ref)
        except AgentRejected:  # a registration of another release's that names what is not here: no edge
            continue
    return out


async def register(runtime: Runtime, agents: Sequence[Agent], *, by: str = "", tools: ToolCatalog | None = None,
                   catalog: AgentCatalog | None = None) -> list[tuple[Agent, Judgement]]:
    """Register ``agents`` (one batch: every one, or none) on ``runtime``'s ``agent.agents`` and return
    once the broker has acknowledged each (``acks=all``), with what each was: ``new``, ``newer`` or
    ``same`` (already there: not published again). Raises ``AgentRejected`` with every problem
    (``batch_problems``; tools are checked against ``tools``, the tool catalogue, when given). ``catalog``:
    the agent catalogue to read (default: one of ``runtime``'s, opened and closed here)."""
    if not agents:
        return []
    by = by or registrar()
    reader = catalog or AgentCatalog.for_runtime(runtime)
    try:
        await reader.refresh()
        stored = reader.events()
        existing = reader.agents()
    finally:
        if catalog is None:
            await reader.close()
    problems = batch_problems(agents, existing, list(await tools.refresh()) if tools is not None else None)
    if problems:
        raise AgentRejected("nothing was registered:" + "".join(f"\n  - {p}" for p in problems))
    outcome: list[tuple[Agent, Judgement]] = []
    publish: list[AgentRegistered] = []
    seen: set[str] = set()
    for agent in sorted(agents, key=lambda a: (a.name, a.version)):
        event = registration(agent, by=by)
        judgement = judge(event, stored.get(agent.name))
        if judgement in ACCEPTED and agent.ref not in seen:
            seen.add(agent.ref)
            publish.append(event)
            stored.setdefault(agent.name, {})[agent.version] = event
        outcome.append((agent, "same" if judgement not in ACCEPTED else judgement))
    acks = [await runtime.send(runtime.topics.agents, e, key=record_key(e)) for e in publish]
    await asyncio.gather(*acks)
    return outcome


class AgentCatalog(CompactedCatalog[AgentRegistered]):
    """A view of ``agent.agents``: every accepted version of every agent (refreshed every ``ttl_s``, or at
    once when a reference does not resolve). Reads as the tool catalogue does (streams/catalog/reader.py);
    a read that fails raises ``AgentCatalogUnavailable``."""

    event_type = AgentRegistered
    label = "agent catalogue"
    creators = "workers and `agentstream dev up` create it"

    def __init__(self, bootstrap: str, topic: str, codec: Codec, *, ttl_s: float = 5.0,
                 timeout_s: float = 10.0, auth: KafkaAuth) -> None:
        super().__init__(bootstrap, topic, codec, ttl_s=ttl_s, timeout_s=timeout_s, auth=auth)
        self._events: dict[str, dict[int, AgentRegistered]] = {}
        self._agents: dict[str, dict[int, Agent]] = {}
        self._reported: set[str] = set()  # refused or unreadable registrations already logged (by event id)

    @classmethod
    def for_runtime(cls, runtime: Runtime, **options: Any) -> AgentCatalog:
        """The catalogue of the pipeline ``runtime`` publishes to (its broker, prefix and codec)."""
        return cls(runtime.settings.kafka_bootstrap, runtime.topics.agents, runtime.codec,
                   auth=runtime.settings.kafka_auth, **options)

    async def refresh(self) -> dict[str, dict[int, Agent]]:
        """Read what has been registered up to now; return every agent's versions."""
        await self._refresh(asked_at=time.monotonic())
        return self._agents

    async def all(self) -> dict[str, dict[int, Agent]]:
        """Every agent's versions (name → version → definition), read within the TTL."""
        await self._maybe_refresh()
        return self._agents

    async def resolve(self, ref: str) -> Agent:
        """The definition ``ref`` names (``name``: its latest version; ``name@version``), after a refresh
        when the cached view does not have it. Raises ``AgentRejected`` naming what exists."""
        parse_ref(ref)  # a malformed reference needs no read
        try:
            return resolve(ref, await self.all())
        except AgentRejected:
            return resolve(ref, await self.refresh())

    def agents(self) -> dict[str, dict[int, Agent]]:
        """The view as last read (no read)."""
        return {name: dict(versions) for name, versions in self._agents.items()}

    def events(self) -> dict[str, dict[int, AgentRegistered]]:
        """The accepted registrations as last read (no read), by name and version."""
        return {name: dict(versions) for name, versions in self._events.items()}

    # -- the reader's hooks (streams/catalog/reader.py) ----------------------------------------
    def _fold(self, registrations: list[AgentRegistered]) -> None:
        events, refused = fold(registrations)
        for refusal in refused:
            self._report(refusal.event, refusal.describe())
        agents: dict[str, dict[int, Agent]] = {}
        for name, versions in events.items():
            for version, event in versions.items():
                try:
                    agent = Agent.from_definition(name, version, event.definition, source=self.topic)
                except AgentRejected as exc:  # one bad registration must not hide the others
                    self._report(event, f"{exc}; ignored")
                    continue
                agents.setdefault(name, {})[version] = agent
        self._events, self._agents = events, agents

    def _report(self, event: AgentRegistered, message: str) -> None:
        if event.event_id not in self._reported:
            self._reported.add(event.event_id)
            log.warning("agent catalogue %s: %s", self.topic, message)

    def _key(self, event: AgentRegistered) -> str:
        return record_key(event)

    def _unavailable(self, message: str) -> AgentCatalogUnavailable:
        return AgentCatalogUnavailable(message)


async def copy_agents(source_topic: str, runtime: Runtime, *, timeout_s: float = 10.0) -> list[str]:
    """Republish every accepted registration of ``source_topic`` on ``runtime``'s agents topic; return
    the refs. A replay session runs on topics of its own: its planner must resolve the agents the
    original pipeline's runs named (as ``copy_catalogue`` does for tools)."""
    source = AgentCatalog(runtime.settings.kafka_bootstrap, source_topic, runtime.codec, timeout_s=timeout_s,
                          auth=runtime.settings.kafka_auth)
    try:
        await source.refresh()
        events = [e for versions in source.events().values() for e in versions.values()]
    finally:
        await source.close()
    acks = [await runtime.send(runtime.topics.agents, e, key=record_key(e)) for e in events]
    await asyncio.gather(*acks)
    return sorted(f"{e.name}@{e.version}" for e in events)


__all__ = ["ACCEPTED", "RUN_ID", "AgentCatalog", "Judgement", "Refused", "batch_problems", "copy_agents", "digest",
           "fold", "judge", "record_key", "register", "registrar", "registration"]
