"""Which tools exist: the compacted topic ``agent.tools``, written by tool workers, read by submit and the planner.

A tool worker publishes one ``ToolRegistered`` per tool it serves and waits for the broker's
acknowledgement before it joins its consumer group, so a task naming a tool is accepted only if some
worker has said it can run it.

Why a topic and not a table: submitting a task is publishing to Kafka, and checking its tool names must
not add PostgreSQL to that path (a database outage used to make every submit fail). One place per
concept: the topic is the only record of registered tools. The ``tools`` table of migration 0002 is
neither written nor read any more (nothing else used it); it stays until a migration drops it.

Versions: which worker started last must not decide a tool's metadata (an older worker restarted during
a rolling upgrade would otherwise turn ``requires_approval`` back off for everyone). A tool's definition
declares a metadata version (``@tool(version=N)``, from 1; registrations from before versions read as 0),
and against the catalogue's current registration of the tool (``judge``):

- a higher version replaces it;
- the same version with the same metadata (description, parameters, ``requires_approval``) is the same
  registration; with other metadata it is a *conflict*, refused;
- a lower version is refused.

So ``requires_approval`` (like anything else) changes only with a newer version. The rule is applied
twice: a worker reads the catalogue before it registers and does not publish a refused registration
(``register`` logs it as an error; the worker still serves the tool, under its own definition), and
every reader folds the topic with the same rule (``current``), so a registration published anyway (a
worker from before this rule, a race between two workers) changes nothing either. For that to survive
compaction, a record's key is ``{name}@{version}:{metadata digest}``, not the name: compaction keeps
every distinct registration, only identical ones collapse, and no record can erase a higher version
(records of workers from before versions, keyed by name alone, are version 0). Equal-version conflicts
are decided by publication order (the first one stays), which is why a worker never republishes a
registration that is already there.

Topics carry the settings' prefix, so each test pipeline and each replay session has a catalogue of
its own; a replay session that plans without serving tools copies the original's (``copy_catalogue``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from agentstream.streams.catalog.reader import CompactedCatalog
from agentstream.streams.config.kafka_auth import KafkaAuth
from agentstream.streams.core.errors import ToolCatalogUnavailable
from agentstream.streams.core.events import ToolRegistered
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.kafka.codec import Codec

if TYPE_CHECKING:
    from agentstream.streams.runtime.publisher import Runtime

log = logging.getLogger(__name__)

#: The ``run_id`` of every registration: the envelope needs one, and a registration belongs to no run.
RUN_ID = "tools"


#: What a registration would do to the catalogue's current one for its tool (``judge``).
Judgement: TypeAlias = Literal["new", "newer", "same", "older", "conflict"]
#: The judgements under which a registration becomes the tool's current one.
ACCEPTED: frozenset[Judgement] = frozenset({"new", "newer"})


def registration(tool: ToolInfo, *, worker: str) -> ToolRegistered:
    """The event saying that ``worker`` serves ``tool``. Its id is derived from what it says, so a worker
    that restarts republishes the same event (same id), and a changed tool is a new event."""
    parameters = json.dumps(tool.parameters, sort_keys=True)
    content = json.dumps([tool.description, parameters, tool.requires_approval, worker, tool.version])
    return ToolRegistered.build(run_id=RUN_ID, step=f"{RUN_ID}:{tool.name}", service="tools",
                                part=hashlib.sha256(content.encode()).hexdigest()[:16], name=tool.name,
                                description=tool.description, parameters=parameters,
                                requires_approval=tool.requires_approval, registered_by=worker,
                                version=tool.version)


def _metadata(event: ToolRegistered) -> tuple[str, str, bool]:
    """What a registration says about its tool (not who registered it), parameters in one spelling."""
    try:
        parameters = json.dumps(json.loads(event.parameters), sort_keys=True)
    except ValueError:
        parameters = event.parameters
    return event.description, parameters, event.requires_approval


def record_key(event: ToolRegistered) -> str:
    """``{name}@{version}:{digest of the metadata}``: one compacted slot per distinct registration."""
    digest = hashlib.sha256(json.dumps([event.version, *_metadata(event)]).encode()).hexdigest()[:16]
    return f"{event.name}@{event.version}:{digest}"


def judge(candidate: ToolRegistered, stored: ToolRegistered | None) -> Judgement:
    """What ``candidate`` would do to ``stored``, the current registration of the same tool."""
    if stored is None:
        return "new"
    if candidate.version != stored.version:
        return "newer" if candidate.version > stored.version else "older"
    return "same" if _metadata(candidate) == _metadata(stored) else "conflict"


@dataclass(frozen=True)
class Refused:
    """A registration the catalogue did not take: ``judgement`` is ``older`` or ``conflict`` against ``stored``."""

    event: ToolRegistered
    stored: ToolRegistered
    judgement: Judgement

    def describe(self) -> str:
        e, s = self.event, self.stored
        why = (f"its version {e.version} is lower than the catalogue's {s.version}" if self.judgement == "older"
               else f"version {e.version} is already registered with other metadata")
        return (f"tool {e.name!r} version {e.version} from {e.registered_by} refused: {why} (registered by "
                f"{s.registered_by}, requires_approval={s.requires_approval}); that registration stays. Declare a "
                f"higher version (@tool(version=...)) to change a tool's metadata")


def current(registrations: Iterable[ToolRegistered]) -> tuple[dict[str, ToolRegistered], list[Refused]]:
    """Each tool's current registration, folding ``registrations`` in the order they were published
    (``judge``), and the ones refused on the way."""
    tools: dict[str, ToolRegistered] = {}
    refused: list[Refused] = []
    for event in registrations:
        stored = tools.get(event.name)
        judgement = judge(event, stored)
        if judgement in ACCEPTED:
            tools[event.name] = event
        elif judgement != "same":
            assert stored is not None
            refused.append(Refused(event, stored, judgement))
    return tools, refused


async def register(runtime: Runtime, tools: Iterable[ToolInfo], *, worker: str) -> list[Refused]:
    """Publish the tools a worker serves on ``agent.tools`` and return once the broker has acknowledged
    every one (``acks=all``): the worker joins its group only then, so no submit that saw the tool can
    reach a pipeline that has not. Reads the catalogue first: a registration that is already there is
    not published again, and one the catalogue would refuse (an older version, or a conflicting one) is
    not published at all but logged as an error and returned."""
    catalog = ToolCatalog.for_runtime(runtime)
    try:
        stored = {e.name: e for e in await catalog.registrations()}
    finally:
        await catalog.close()
    publish: list[ToolRegistered] = []
    refused: list[Refused] = []
    for tool in tools:
        event = registration(tool, worker=worker)
        previous = stored.get(tool.name)
        judgement = judge(event, previous)
        if judgement in ACCEPTED:
            publish.append(event)
        elif judgement != "same":
            assert previous is not None
            refused.append(Refused(event, previous, judgement))
            log.error("tool catalogue: %s", refused[-1].describe())
    await _publish(runtime, publish)
    return refused


async def _publish(runtime: Runtime, events: list[ToolRegistered]) -> None:
    acks = [await runtime.send(runtime.topics.tools, e, key=record_key(e)) for e in events]
    await asyncio.gather(*acks)


def _info(event: ToolRegistered) -> ToolInfo | None:
    """The registration as a ToolInfo, or None when its parameters are not a JSON object (logged: one
    bad registration must not make every submit fail)."""
    try:
        parameters = json.loads(event.parameters)
    except ValueError:
        parameters = None
    if not isinstance(parameters, dict):
        log.warning("tool catalogue: %s registered by %s has parameters that are not a JSON object; ignored",
                    event.name, event.registered_by)
        return None
    return ToolInfo(event.name, event.description, parameters, event.requires_approval, event.version)


class ToolCatalog(CompactedCatalog[ToolRegistered]):
    """A view of ``agent.tools`` (refreshed every ``ttl_s``, or at once on an unknown name).

    One consumer without a group, assigned to the topic's only partition: the first refresh reads it
    from the beginning up to its end offset, later ones read only what was published since. Every read
    is bounded by ``timeout_s`` and raises ``ToolCatalogUnavailable`` past it. Concurrent callers share
    one read: a refresh asked for while another was running waits for the next one, not for a third
    (streams/catalog/reader.py).
    """

    event_type = ToolRegistered
    label = "tool catalogue"
    creators = "tool workers and `agentstream dev up` create it"

    def __init__(self, bootstrap: str, topic: str, codec: Codec, *, ttl_s: float = 5.0,
                 timeout_s: float = 10.0, auth: KafkaAuth) -> None:
        super().__init__(bootstrap, topic, codec, ttl_s=ttl_s, timeout_s=timeout_s, auth=auth)
        #: Each tool's current registration (``current`` over the records in offset order).
        self._events: dict[str, ToolRegistered] = {}
        self._reported: set[str] = set()  # refused registrations already logged (by event id)
        self._tools: dict[str, ToolInfo] = {}

    @classmethod
    def for_runtime(cls, runtime: Runtime, **options: Any) -> ToolCatalog:
        """The catalogue of the pipeline ``runtime`` publishes to (its broker, prefix and codec)."""
        return cls(runtime.settings.kafka_bootstrap, runtime.topics.tools, runtime.codec,
                   auth=runtime.settings.kafka_auth, **options)

    async def refresh(self) -> dict[str, ToolInfo]:
        """Read what has been registered up to now; return every tool by name."""
        await self._refresh(asked_at=time.monotonic())
        return self._tools

    async def all(self) -> dict[str, ToolInfo]:
        await self._maybe_refresh()  # any read newer than the TTL will do
        return self._tools

    async def unknown(self, names: list[str]) -> list[str]:
        """The names no tool worker has registered (after a refresh, so a new worker is seen at once)."""
        tools = await self.all()
        missing = [n for n in names if n not in tools]
        if missing:
            tools = await self.refresh()
            missing = [n for n in names if n not in tools]
        return missing

    async def describe(self, names: list[str]) -> list[ToolInfo]:
        tools = await self.all()
        return [tools[n] for n in names if n in tools]

    async def registrations(self) -> list[ToolRegistered]:
        """The current registration of every tool, as published (after a refresh)."""
        await self.refresh()
        return list(self._events.values())

    # -- the reader's hooks (streams/catalog/reader.py) ----------------------------------------
    def _fold(self, registrations: list[ToolRegistered]) -> None:
        events, refused = current(registrations)
        for refusal in refused:
            if refusal.event.event_id not in self._reported:
                self._reported.add(refusal.event.event_id)
                log.warning("tool catalogue %s: %s", self.topic, refusal.describe())
        self._events = events
        self._tools = {name: info for name, e in events.items() if (info := _info(e)) is not None}

    def _key(self, event: ToolRegistered) -> str:
        return record_key(event)

    def _unavailable(self, message: str) -> ToolCatalogUnavailable:
        return ToolCatalogUnavailable(message)


async def copy_catalogue(source_topic: str, runtime: Runtime, *, timeout_s: float = 10.0) -> list[str]:
    """Republish every registration of ``source_topic`` on ``runtime``'s tools topic; return the names.

    A replay session runs on topics of its own and, except in live mode, serves no tools: its planner
    must still know the tools the original pipeline's workers registered, or it would refuse the
    replayed task's tools."""
    source = ToolCatalog(runtime.settings.kafka_bootstrap, source_topic, runtime.codec, timeout_s=timeout_s,
                         auth=runtime.settings.kafka_auth)
    try:
        events = await source.registrations()
    finally:
        await source.close()
    await _publish(runtime, events)
    return sorted(e.name for e in events)
