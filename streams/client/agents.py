"""The client's agent catalogue (``AgentClient.agents``): register definitions, list them, show one; and
loading definitions from a Python module or a YAML file (what ``agentstream agent register`` takes).

    async with AgentClient() as client:
        await client.agents.register(Agent(name="support", system_prompt="...", tools=["order_status"]))
        latest = await client.agents.show("support")            # or "support@1"
        run_id = await client.submit("Where is order 42?", agent="support")

A YAML file holds one definition (a mapping of its fields), several (a list of them, or ``agents:`` and
a list), or several documents (``---``); the fields are ``Agent``'s (docs/agents.md). A module's
definitions are its top-level ``Agent`` objects. Registering reads the catalogue and the tool catalogue
first and refuses the whole batch with every problem (streams/catalog/agents.py, ``batch_problems``).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentstream.streams.catalog.agents import AgentCatalog, Judgement, register
from agentstream.streams.core.agents import Agent
from agentstream.streams.core.errors import AgentRejected
from agentstream.streams.core.extras import missing_extra

if TYPE_CHECKING:
    from agentstream.streams.client.agent_client import AgentClient

YAML_SUFFIXES = (".yaml", ".yml")


class AgentsClient:
    """The pipeline's agent definitions, through its ``AgentClient`` (``client.agents``)."""

    def __init__(self, client: AgentClient) -> None:
        self._client = client
        self._catalog: AgentCatalog | None = None

    def catalog(self) -> AgentCatalog:
        """The client's view of ``agent.agents`` (opened on first use, closed with the client)."""
        if self._catalog is None:
            self._catalog = AgentCatalog.for_runtime(self._client.runtime)
        return self._catalog

    async def register(self, *agents: Agent, by: str = "") -> list[tuple[Agent, Judgement]]:
        """Register ``agents`` as one batch (all or none) and return what each was: ``new`` (its first
        version), ``newer`` or ``same`` (already registered as it is). Raises ``AgentRejected`` naming every
        problem: an unknown tool or agent, a cycle of calls, a changed definition under a registered version,
        a new version below the latest. ``by``: who registers (default: this host and process)."""
        catalog = self.catalog()
        result = await register(self._client.runtime, list(agents), by=by, tools=await self._client._tool_catalog(),
                                catalog=catalog)
        await catalog.refresh()  # this client sees what it registered at once
        return result

    async def list(self) -> dict[str, dict[int, Agent]]:
        """Every agent's registered versions: name → version → definition (fresh from the topic)."""
        return await self.catalog().refresh()

    async def show(self, ref: str) -> Agent:
        """The definition ``ref`` names: ``name`` (the latest version) or ``name@version``. Raises
        ``AgentRejected`` naming the agents, or the agent's versions, that exist."""
        return await self.catalog().resolve(ref)

    async def close(self) -> None:
        if self._catalog is not None:
            await self._catalog.close()


def load(target: str) -> list[Agent]:
    """The definitions ``target`` holds: a YAML file (``.yaml``/``.yml``, or any file that exists) or an
    importable module (``mypkg.agents``: its top-level ``Agent`` objects). Raises ``AgentRejected``."""
    path = Path(target).expanduser()
    if path.suffix.lower() in YAML_SUFFIXES or path.is_file():
        if not path.is_file():
            raise AgentRejected(f"no file {target}")
        return from_yaml(path.read_text(), source=str(path))
    return from_module(target)


def from_module(name: str) -> list[Agent]:
    """Every ``Agent`` at the top level of the module ``name`` (imported), by name and version."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise AgentRejected(f"no module {name!r} (and no file of that name): give a module that defines Agent "
                                "objects, or a YAML file") from exc
        raise
    found = {id(v): v for v in vars(module).values() if isinstance(v, Agent)}
    if not found:
        raise AgentRejected(f"module {name!r} defines no Agent at its top level")
    return sorted((_sourced(a, name) for a in found.values()), key=lambda a: (a.name, a.version))


def from_yaml(text: str, *, source: str = "") -> list[Agent]:
    """The definitions of a YAML text: a mapping (one), a list, or ``agents:`` and a list; several
    documents allowed. Needs PyYAML (the ``deploy`` extra)."""
    try:
        import yaml
    except ModuleNotFoundError as exc:
        missing = missing_extra(exc, "reading agent definitions from YAML")
        if missing is None:
            raise
        raise missing from exc
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise AgentRejected(f"{source or 'the YAML'} is not valid YAML: {exc}") from exc
    agents = [Agent.from_mapping(item, source=source) for doc in documents for item in _items(doc, source)]
    if not agents:
        raise AgentRejected(f"{source or 'the YAML'} defines no agent")
    return agents


def _items(document: Any, source: str) -> Iterable[Any]:
    if isinstance(document, dict) and set(document) == {"agents"}:
        document = document["agents"]
    if isinstance(document, list):
        return document
    if isinstance(document, dict):
        return [document]
    raise AgentRejected(f"{source or 'the YAML'}: a document must be an agent's fields, a list of agents or "
                        f"'agents:' and a list, not {type(document).__name__}")


def _sourced(agent: Agent, source: str) -> Agent:
    return agent if agent.source else dataclasses.replace(agent, source=source)


__all__ = ["AgentsClient", "from_module", "from_yaml", "load"]
