"""Agent definitions: a named, versioned agent — what a task naming it runs with.

    support = Agent(name="support", version=2, description="Answers customers' questions.",
                    system_prompt="You are a support agent...", tools=["order_status"],
                    max_steps=12, temperature=0.2, calls=["research"], handoffs=["billing"])

A definition is registered on the compacted ``agent.agents`` (streams/catalog/agents.py); a task names it
(``TaskSubmitted.agent``: ``support``, the latest version, or ``support@2``, that one), and the planner
starts the run with the definition's fields (services/planner/agents.py). docs/agents.md has the rules.

**Versions and digests.** A definition's ``digest`` is a SHA-256 of its *definition JSON* — every field
but ``name`` and ``version``, in the order of this class, fields at their default left out (so a field a
later release adds, with its default, leaves older definitions' digests as they were) — and the
catalogue applies the tool catalogue's rules: a version not seen before and higher than the current one
is taken; the same version with the same digest is the same registration; the same version with another
digest (a changed definition) and a lower version than the current one are refused.

**What a task naming an agent may still set** (``task_override_problem``): its text, deadline (the
earlier of the task's and the definition's ``deadline_s`` applies), metadata, session and run id. Every
field the definition decides (tools, model, system prompt, output schema, generation settings, tool
calling, prefetch, ``on_tool_error``) must be left at its default; ``max_steps``, which a task must carry,
is not used (the definition's is).

Pure: no I/O. Loading definitions from a module or a YAML file: streams/client/agents.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

from agentstream.streams.core import task_rules, tool_calling
from agentstream.streams.core.errors import AgentRejected
from agentstream.streams.core.kinds import ON_TOOL_ERROR, OnToolError

#: An agent's name: letters, digits, ``_`` and ``-``, 1 to 64 of them (an OpenAI function name's rule:
#: a sub-agent may be offered to a model as a tool).
NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: A reference to an agent: its name (the latest version) or ``name@version`` (that version).
REF: Final = re.compile(r"(?P<name>[A-Za-z0-9_-]{1,64})(?:@(?P<version>[0-9]{1,10}))?")
MAX_VERSION = 2**31 - 1  # an Avro int
MAX_DESCRIPTION_BYTES = 4 * 1024
#: Agents one definition may name in ``calls`` and in ``handoffs`` (each).
MAX_REFS = 64
DEFAULT_MAX_STEPS = 8


@dataclass(frozen=True, kw_only=True)
class Agent:
    """A named, versioned agent definition; constructing one checks it (``AgentRejected`` says what is
    wrong). Registered with ``agentstream agent register`` (a module of ``Agent`` objects, or a YAML file)
    or ``AgentClient.agents.register``; named by a task with ``submit(..., agent="name")`` or
    ``agent="name@version"``.

    ``tools``: the tools its runs may call (registered tools only). ``model``: the model its requests ask
    for (None: the inference worker's). ``backend``: a hint of the engine it is meant for, recorded and
    shown (runs are not routed by it yet). ``collection``: the retrieval collection its runs search (None:
    ``default``). ``prefetch``, ``on_tool_error``, ``output_schema`` (a JSON Schema: a mapping or JSON
    text), ``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed`` and ``tool_calling``: as the task
    fields of those names (docs/contract.md). ``max_steps`` and ``deadline_s`` (seconds from the run's
    start): its runs' limits. ``calls``: the agents it may call as sub-agents, ``handoffs``: the agents it
    may hand the conversation to (references, ``name`` or ``name@version``; sub-agents and handoffs are not
    run yet: docs/agents.md).
    """

    name: str
    version: int = 1
    description: str = ""
    system_prompt: str | None = None
    model: str | None = None
    backend: str | None = None
    tools: Sequence[str] = ()
    collection: str | None = None
    prefetch: bool = True
    on_tool_error: OnToolError = "tell_model"
    output_schema: str | Mapping[str, Any] | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: Sequence[str] = ()
    seed: int | None = None
    tool_calling: str | None = None
    max_steps: int = DEFAULT_MAX_STEPS
    deadline_s: float | None = None
    calls: Sequence[str] = ()
    handoffs: Sequence[str] = ()
    #: Where the definition came from (a module, a file): shown in errors, not part of the definition.
    source: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("tools", "stop", "calls", "handoffs"):  # any sequence in, a tuple kept (hashable, frozen)
            value = getattr(self, name)
            if isinstance(value, Sequence) and not isinstance(value, str):
                object.__setattr__(self, name, tuple(value))
        for name in ("temperature", "top_p", "deadline_s"):  # 1 and 1.0 are one definition (and one digest)
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        schema = self.output_schema
        if isinstance(schema, Mapping):
            try:
                object.__setattr__(self, "output_schema", json.dumps(schema, ensure_ascii=False, allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise AgentRejected(f"{self.label}: the output schema cannot be written as JSON: {exc}") from exc
        problem = definition_problem(self)
        if problem:
            raise AgentRejected(f"{self.label}: {problem}")

    @property
    def label(self) -> str:
        """``agent 'support' version 2`` (and where it came from), for messages."""
        where = f" (from {self.source})" if self.source else ""
        return f"agent {self.name!r} version {self.version}{where}"

    @property
    def schema_text(self) -> str | None:
        """The output schema as JSON text (a mapping given is encoded when the definition is made)."""
        return cast("str | None", self.output_schema)

    @property
    def ref(self) -> str:
        """The exact reference, ``name@version``: what a run records."""
        return f"{self.name}@{self.version}"

    def definition(self) -> dict[str, Any]:
        """Every field but ``name`` and ``version``, in field order, those at their default left out; an
        output schema as the JSON object it is. What ``agent.agents`` carries and the digest covers."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("name", "version", "source"):
                continue
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if value == default:
                continue
            if f.name == "output_schema":
                value = json.loads(self.schema_text or "null")
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def definition_json(self) -> str:
        """``definition()`` as compact JSON text, keys in field order (an output schema's keys as given)."""
        return canonical(self.definition())

    @property
    def digest(self) -> str:
        """The first 16 hex digits of the SHA-256 of ``definition_json()``."""
        return digest_of(self.definition_json())

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "", strict: bool = True) -> Agent:
        """A definition from a mapping of its fields (a YAML document, ``name`` and ``version`` included).
        ``strict``: an unknown field is refused (a typo in a file); else it is left out (a definition a
        later release wrote, read by this one)."""
        if not isinstance(data, Mapping):
            raise AgentRejected(f"an agent definition{f' in {source}' if source else ''} must be a mapping of its "
                                f"fields, not {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)} - {"source"}
        unknown = sorted(str(k) for k in data if k not in known)
        if unknown and strict:
            raise AgentRejected(f"agent {data.get('name', '?')!r}{f' in {source}' if source else ''}: unknown "
                                f"field(s) {', '.join(unknown)}; the fields are {', '.join(sorted(known))}")
        if "name" not in data:
            raise AgentRejected(f"an agent definition{f' in {source}' if source else ''} has no name")
        try:
            return cls(**{k: v for k, v in data.items() if k in known}, source=source)
        except TypeError as exc:  # a field given twice, or the like
            raise AgentRejected(f"agent {data.get('name', '?')!r}: {exc}") from exc

    @classmethod
    def from_definition(cls, name: str, version: int, definition: str, *, source: str = "") -> Agent:
        """A definition as ``agent.agents`` carries it (``AgentRegistered``); fields this release does not
        know are left out."""
        try:
            data = json.loads(definition)
        except ValueError as exc:
            raise AgentRejected(f"agent {name!r} version {version}: its definition is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise AgentRejected(f"agent {name!r} version {version}: its definition is not a JSON object")
        schema = data.get("output_schema")
        if isinstance(schema, (dict, list, bool)):
            data["output_schema"] = json.dumps(schema, ensure_ascii=False)
        return cls.from_mapping({**data, "name": name, "version": version}, source=source, strict=False)


def canonical(definition: Mapping[str, Any]) -> str:
    """Compact JSON, keys in the order given (the digest's input)."""
    return json.dumps(definition, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def digest_of(definition_json: str) -> str:
    """The digest of a definition as published: its JSON re-written compactly (so spacing does not count)."""
    try:
        text = canonical(json.loads(definition_json))
    except ValueError:
        text = definition_json
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def parse_ref(ref: str) -> tuple[str, int | None]:
    """``support`` → ``("support", None)``, ``support@3`` → ``("support", 3)``; raises ``AgentRejected``."""
    match = REF.fullmatch(ref) if isinstance(ref, str) else None
    if match is None or (match["version"] is not None and not 1 <= int(match["version"]) <= MAX_VERSION):
        raise AgentRejected(f"{ref!r} is not an agent reference: a name of letters, digits, _ and - (at most 64), "
                            "optionally @ and a version from 1")
    return match["name"], int(match["version"]) if match["version"] is not None else None


def ref_problem(ref: Any) -> str | None:
    """Why ``ref`` (a task's ``agent``) is not an agent reference, or None."""
    try:
        parse_ref(ref)
    except AgentRejected as exc:
        return str(exc)
    return None


def resolve(ref: str, versions: Mapping[str, Mapping[int, Agent]]) -> Agent:
    """The definition ``ref`` names among ``versions`` (name → version → definition): the highest version
    for a bare name. Raises ``AgentRejected`` naming the agents, or the agent's versions, that exist."""
    name, version = parse_ref(ref)
    known = versions.get(name)
    if not known:
        names = ", ".join(sorted(versions)) or "none"
        raise AgentRejected(f"unknown agent {name!r}; registered agents: {names}")
    if version is None:
        return known[max(known)]
    if version not in known:
        raise AgentRejected(f"agent {name!r} has no version {version}; its versions: "
                            f"{', '.join(str(v) for v in sorted(known))}")
    return known[version]


def definition_problem(agent: Agent) -> str | None:
    """Why ``agent`` is not a valid definition, or None (constructing one checks this)."""
    if not isinstance(agent.name, str) or not NAME.fullmatch(agent.name):
        return f"the name {agent.name!r} must be 1 to 64 letters, digits, _ or -"
    if isinstance(agent.version, bool) or not isinstance(agent.version, int) or not 1 <= agent.version <= MAX_VERSION:
        return f"the version must be an integer from 1 to {MAX_VERSION} (got {agent.version!r})"
    problem = (task_rules.text_problem("description", agent.description, MAX_DESCRIPTION_BYTES, required=False)
               or (None if isinstance(agent.description, str) else "the description must be a string")
               or task_rules.text_problem("system prompt", agent.system_prompt, task_rules.MAX_SYSTEM_PROMPT_BYTES)
               or task_rules.text_problem("model", agent.model, task_rules.MAX_NAME_BYTES)
               or task_rules.text_problem("backend", agent.backend, task_rules.MAX_NAME_BYTES)
               or _collection_problem(agent.collection)
               or _tools_problem(agent.tools)
               or task_rules.generation_problem(
                   output_schema=agent.output_schema, max_tokens=agent.max_tokens, temperature=agent.temperature,
                   top_p=agent.top_p, stop=agent.stop, seed=agent.seed,
                   max_tokens_limit=task_rules.MAX_TOKENS_CEILING)
               or tool_calling.problem(agent.tool_calling)
               or _refs_problem("calls", agent.calls) or _refs_problem("handoffs", agent.handoffs))
    if problem:
        return problem
    if not isinstance(agent.prefetch, bool):
        return "prefetch must be true or false"
    if agent.on_tool_error not in ON_TOOL_ERROR:
        return f"on_tool_error must be one of {', '.join(ON_TOOL_ERROR)} (got {agent.on_tool_error!r})"
    steps = agent.max_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= task_rules.MAX_STEPS_LIMIT:
        return f"max_steps must be an integer from 1 to {task_rules.MAX_STEPS_LIMIT} (got {steps!r})"
    limit = agent.deadline_s
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                              or not math.isfinite(limit) or limit <= 0):
        return f"deadline_s must be a positive number of seconds (got {limit!r})"
    return None


def _collection_problem(collection: Any) -> str | None:
    if collection is None:
        return None
    return task_rules.text_problem("retrieval collection", collection, task_rules.MAX_NAME_BYTES, required=True)


def _tools_problem(tools: Any) -> str | None:
    if not isinstance(tools, tuple):
        return "tools must be a list of tool names"
    if len(tools) > task_rules.MAX_TOOLS:
        return f"an agent may name at most {task_rules.MAX_TOOLS} tools (got {len(tools)})"
    if len(set(tools)) != len(tools):
        return "a tool is named twice"
    for name in tools:
        if problem := task_rules.text_problem("tool name", name, task_rules.MAX_NAME_BYTES, required=True):
            return problem
    return None


def _refs_problem(what: str, refs: Any) -> str | None:
    if not isinstance(refs, tuple):
        return f"{what} must be a list of agent references"
    if len(refs) > MAX_REFS:
        return f"{what} names {len(refs)} agents; the limit is {MAX_REFS}"
    names = []
    for ref in refs:
        if problem := ref_problem(ref):
            return f"{what}: {problem}"
        names.append(parse_ref(ref)[0])
    if len(set(names)) != len(names):
        return f"{what} names an agent twice"
    return None


#: The task fields a definition decides, with the value that means "not set" (a task naming an agent must
#: leave each so). ``max_steps`` is not among them: a task carries one, and it is not used.
DECIDED: Final[dict[str, Any]] = {
    "tools": [], "model": None, "system_prompt": None, "output_schema": None, "max_tokens": None,
    "temperature": None, "top_p": None, "stop": [], "seed": None, "tool_calling": None, "prefetch": True,
    "on_tool_error": "tell_model",
}


def task_override_problem(agent: str, fields: Mapping[str, Any], *, also: Sequence[str] = ()) -> str | None:
    """Why a task naming ``agent`` cannot run with ``fields`` (the task's fields by name): it sets one the
    definition decides (``DECIDED``; ``also``: more names the caller found set, as the client's
    ``max_steps``). A task naming an agent adds its text, deadline, metadata and session."""
    set_ = [name for name, unset in DECIDED.items() if name in fields and _given(fields[name], unset)] + list(also)
    if not set_:
        return None
    return (f"a task naming agent {agent!r} takes {', '.join(set_)} from the agent's definition: leave "
            f"{'it' if len(set_) == 1 else 'them'} out (a task naming an agent sets its text, deadline, metadata "
            "and session), or register a new version of the agent")


def _given(value: Any, unset: Any) -> bool:
    if isinstance(unset, list):
        return bool(value)
    return bool(value != unset)


def call_cycle(graph: Mapping[str, Iterable[str]], start: Iterable[str]) -> list[str] | None:
    """A cycle of ``graph`` (node → the nodes it calls) reachable from ``start``, as the path that closes it
    (``["a@1", "b@2", "a@1"]``), or None. Depth first, without recursion."""
    done: set[str] = set()
    for root in start:
        if root in done:
            continue
        path, on_path = [root], {root}
        stack: list[Iterator[str]] = [iter(graph.get(root, ()))]
        while stack:
            child = next(stack[-1], None)
            if child is None:
                stack.pop()
                node = path.pop()
                on_path.discard(node)
                done.add(node)
            elif child in on_path:
                return [*path[path.index(child):], child]
            elif child not in done:
                path.append(child)
                on_path.add(child)
                stack.append(iter(graph.get(child, ())))
    return None


__all__ = ["DECIDED", "DEFAULT_MAX_STEPS", "MAX_REFS", "NAME", "REF", "Agent", "call_cycle", "canonical",
           "definition_problem", "digest_of", "parse_ref", "ref_problem", "resolve", "task_override_problem"]
