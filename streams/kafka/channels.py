"""The topic contract: which events each topic carries, and which parties produce and consume it.

One place for three readers: the AsyncAPI document (``agentstream/ops/asyncapi.py``) describes it, the ACLs
(``agentstream/ops/acls.py``) give each party's principal exactly the topics it produces and consumes, and the
runtime (``streams/runtime/runner.py``) refuses a record whose event type its topic does not carry. The last
closes what the ACLs alone leave open: Kafka authorizes a principal per topic, not per event type, so
without it anyone who may write the intake (a client, a tenant) could publish a model's reply there, and
the planner, which dispatches by event type, would take it (issue 37, finding 1). With both, an event
is accepted only on its own topic, and only the parties the ACLs name can write that topic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agentstream.streams.core.events import (
    AgentRegistered,
    AlertRaised,
    ApprovalDecided,
    ClaimCheck,
    DeadLetter,
    Event,
    InferenceCompleted,
    InferenceRequested,
    RetrievalCompleted,
    RetrievalRequested,
    RunCancelRequested,
    RunCompleted,
    RunFailed,
    RunStateSnapshot,
    SessionUpdated,
    TaskSubmitted,
    TokenChunk,
    ToolCallCompleted,
    ToolCallRequested,
    ToolRegistered,
)
from agentstream.streams.kafka.topics import Topics

RUN_KEY = "the run id, as raw UTF-8 bytes (no schema, no serializer framing)"

#: The parts of agentstream (and the outside) that produce or consume topics.
PARTIES: dict[str, str] = {
    "client": "AgentClient and the `agentstream` CLI (submit, cancel, approve/deny, wait, stream)",
    "planner": "the planner service (group `agentstream.planner`)",
    "inference": "the inference service (group `agentstream.inference`)",
    "tools": "the tool service (group `agentstream.tools`)",
    "retrieval": "the retrieval service (group `agentstream.retrieval`)",
    "replay": "`agentstream replay`: the re-run submits the task, and the recorded-results responder (groups "
              "`agentstream.replay-{inference,tools,retrieval}`) answers requests, on the replay's own topic prefix",
    "alerts": "the alerting app (services/alerts, faust-streaming)",
    "dlq-cli": "`agentstream dlq` (list, show, re-drive)",
    "foreign": "producers in other languages (Java, Go, Node, confluent-kafka, kcat): docs/contract.md",
}
#: Parties that consume through a consumer group named ``Topics.group(party)``.
GROUPED = ("planner", "inference", "tools", "retrieval")


@dataclass(frozen=True)
class ChannelSpec:
    """One topic: ``topic`` is the ``Topics`` property that names it."""

    topic: str
    events: tuple[type[Event], ...]
    producers: tuple[str, ...]
    consumers: tuple[str, ...]
    description: str
    key: str = RUN_KEY
    #: Events over ``AGENTSTREAM_MAX_EVENT_BYTES`` may travel as a ClaimCheck (streams/kafka/claims.py): on the
    #: topics whose events can grow (conversations, results) and whose readers redeem them.
    claim_checks: bool = True
    #: Sent while handling a record (``Context.emit``), so its events carry ``agentstream-source``.
    emitted: bool = True
    #: A record on another partition than its run's, or not keyed by its run id, is forwarded there
    #: (``ServiceConfig.route_by_run``).
    routed: bool = False
    #: Read by a ServiceRunner, so a dead letter can be re-driven to it (``agentstream dlq redrive``).
    redrivable: bool = False
    #: Its grouped consumers read it through their service's consumer group (else: assigned, no group).
    grouped: bool = True


CHANNELS: tuple[ChannelSpec, ...] = (
    ChannelSpec("tasks", (TaskSubmitted, RunCancelRequested, ApprovalDecided),
                ("client", "replay", "foreign", "planner"), ("planner",),
                "The intake: tasks, cancellations and approval decisions, keyed by run. The one topic other "
                "producers write to; the planner writes the tasks of sub-agents' runs and the cancellation of "
                "those a parent leaves behind.", claim_checks=False, emitted=False, routed=True, redrivable=True),
    ChannelSpec("inference_requests", (InferenceRequested,), ("planner",), ("inference", "replay"),
                "Model calls the planner asks for.", redrivable=True),
    ChannelSpec("inference_results", (InferenceCompleted,), ("inference", "replay"), ("planner", "alerts"),
                "Model replies.", routed=True, redrivable=True),
    ChannelSpec("tokens", (TokenChunk,), ("inference",), ("client",),
                "Generated text as it is made (AgentClient.stream).", claim_checks=False),
    ChannelSpec("retrieval_requests", (RetrievalRequested,), ("planner", "tools"), ("retrieval", "replay"),
                "Searches: a run's retrieval steps, its speculative prefetch (`{run_id}:prefetch`) and "
                "tools' own searches (`{tool step}/retrieve`).", redrivable=True),
    ChannelSpec("retrieval_results", (RetrievalCompleted,), ("retrieval", "replay"), ("planner", "tools"),
                "Passages found.", routed=True, redrivable=True),
    ChannelSpec("tool_requests", (ToolCallRequested,), ("planner",), ("tools", "replay"),
                "Tool calls the model asked for (after approval when the tool needs it).", redrivable=True,
                key=RUN_KEY + "; a call of a fan-out (several calls of one model reply) is keyed by its step id "
                "instead, so that the calls run side by side"),
    ChannelSpec("tool_results", (ToolCallCompleted,), ("tools", "replay", "planner"), ("planner", "alerts"),
                "Tool results and errors; the planner writes a sub-agent run's outcome as its parent step's result.", routed=True, redrivable=True),
    ChannelSpec("runs", (RunStateSnapshot,), ("planner",), (),
                "The latest state of every run (compacted), for anyone to read: its final state and a state that waits "
                "for approval at once; a running run's at most once per AGENTSTREAM_SNAPSHOT_INTERVAL_MS (1 s)."),
    ChannelSpec("sessions", (SessionUpdated,), ("planner", "client"), (),
                "Each session's transcript after each of its turns (compacted), for anyone to read; `agentstream "
                "session delete` writes the session's tombstone. PostgreSQL's `sessions` is the record.",
                key="the session id, raw UTF-8 (its partition is its turns' runs')"),
    ChannelSpec("outcomes", (RunCompleted, RunFailed), ("planner",), ("client", "inference"),
                "How each run ended: what clients wait for (the inference service stops generations of runs "
                "that ended).", claim_checks=False),
    ChannelSpec("dlq", (DeadLetter,), ("planner", "inference", "tools", "retrieval", "replay"), ("dlq-cli",),
                "Records a service gave up on, with the reason (docs/operations.md, \"Dead letters\").",
                key="the run id when it is known, else empty (raw UTF-8)", claim_checks=False, emitted=False),
    ChannelSpec("alerts", (AlertRaised,), ("alerts",), (),
                "Thresholds crossed: slow steps, tool failure rates, consumer lag.",
                key="the alert's subject (a tool, a model, `group/topic`), raw UTF-8", claim_checks=False,
                emitted=False),
    ChannelSpec("tools", (ToolRegistered,), ("tools",), ("client", "planner", "tools"),
                "The tools workers serve (compacted: every distinct registration; readers take each tool's highest "
                "version, and refuse a lower one or a conflicting one of the same version), read whole by submit, "
                "the planner and the tool service (which refuses to register a downgrade).", key="`{name}@{version}:{metadata digest}` (records from before versions: the tool's "
                "name), raw UTF-8", claim_checks=False, emitted=False),
    ChannelSpec("agents", (AgentRegistered,), ("client",), ("client", "planner"),
                "Agent definitions (compacted: every distinct registration; readers keep every version of each "
                "agent and refuse a changed definition under a registered version or a new lower one), written "
                "by `agentstream agent register`, read whole by submit and the planner to resolve a task's "
                "`agent` (docs/agents.md).", key="`{name}@{version}:{digest}`, raw UTF-8", claim_checks=False,
                emitted=False),
    ChannelSpec("schemas", (), ("planner", "inference", "tools", "retrieval", "alerts", "replay"),
                ("client", "planner", "inference", "tools", "retrieval", "alerts", "replay", "dlq-cli"),
                "The Avro schemas the services write with (compacted, one partition), without a schema registry: "
                "each service publishes its schemas before it writes with them, and a reader that meets a "
                "schema id it does not know reads this topic to its end (a rolling upgrade: docs/upgrades.md). "
                "Readers learn only compatible versions of their own events (streams/kafka/schema_guard.py). Clients "
                "and other producers may not write it on a secure stack (AgentClient publishes its schemas only "
                "where a broker without ACLs lets it): they write with schemas the services know, so they are "
                "upgraded after the services. Not used with a schema registry.",
                key="the schema id (as in the values' header), ASCII decimal", claim_checks=False, emitted=False,
                grouped=False),
)


def accepted_events(topics: Topics) -> dict[str, frozenset[str]]:
    """Topic name -> the schema names of the events it carries (with ``ClaimCheck`` where the channel
    allows claim checks). The schemas topic carries no events: it is absent, like any topic outside the
    contract (a test's own, a faust changelog), on which nothing is refused."""
    accepted: dict[str, frozenset[str]] = {}
    for spec in CHANNELS:
        if not spec.events:
            continue
        names = {event.schema_name for event in spec.events}
        if spec.claim_checks:
            names.add(ClaimCheck.schema_name)
        accepted[getattr(topics, spec.topic)] = frozenset(names)
    return accepted


def refusal(accepted: Mapping[str, frozenset[str]], topic: str, event: Event) -> str | None:
    """Why ``event`` may not arrive on ``topic``, or None. A claim check is judged by the event it stands
    for as well: the type it claims must be one the topic carries."""
    names = accepted.get(topic)
    if names is None:
        return None
    name = event.schema_name
    if name not in names:
        return (f"{type(event).__name__} is not an event of {topic} (it carries "
                f"{', '.join(sorted(n.rsplit('.', 1)[-1] for n in names))})")
    if isinstance(event, ClaimCheck) and event.event_type not in names:
        return f"a claim check for {event.event_type.rsplit('.', 1)[-1]} is not an event of {topic}"
    return None


__all__ = ["CHANNELS", "GROUPED", "PARTIES", "RUN_KEY", "ChannelSpec", "accepted_events", "refusal"]
