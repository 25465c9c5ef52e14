"""Settings: what every command and service starts from.

Where a setting comes from, first match wins:

1. the environment (``KAFKA_BOOTSTRAP_SERVERS``, ``DATABASE_URL``, ``AGENTSTREAM_*``): a user's own
   cluster and database;
2. the state file that ``agentstream dev up`` writes (``<state dir>/stack.json``, ``stack_state``): the
   local stack, where who the process is (``identity``) picks its credentials;
3. the defaults of the local stack (its loopback ports).

The other settings of this package: ``telemetry``, ``alerts``, ``quotas``, ``trtllm``, ``generation``; the
parsers they share are in ``env``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentstream.streams.config import env
from agentstream.streams.config.generation import GenerationSettings
from agentstream.streams.config.identity import CLIENT, Identity, env_database_url, load_kafka_auth, login_url
from agentstream.streams.config.kafka_auth import KafkaAuth, kafka_options
from agentstream.streams.config.masking import masked_repr
from agentstream.streams.config.quotas import Quotas
from agentstream.streams.config.sessions import SessionSettings
from agentstream.streams.config.stack_state import (
    DEFAULT_DATABASE,
    DEFAULT_KAFKA_PORT,
    DEFAULT_POSTGRES_PORT,
    StackPaths,
    read_state,
)
from agentstream.streams.config.telemetry import TelemetrySettings
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.kinds import APPROVAL_MODES, ApprovalMode, one_of


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Connection settings every command and service starts from."""

    kafka_bootstrap: str
    database_url: str
    #: Which of the two came from the environment (a user's own cluster) rather than the local stack.
    external_kafka: bool = False
    external_database: bool = False
    paths: StackPaths = field(default_factory=StackPaths.from_env)
    #: Prepended to every topic and consumer-group name: isolates tests and replays.
    topic_prefix: str = ""
    #: Partitions of each run-keyed topic (the planner's inputs must agree, so it is one number).
    partitions: int = 8
    #: Replicas of each topic agentstream creates; with more than one, a write (``acks=all``) needs all
    #: but one in sync (``min.insync.replicas``). The local stack records its cluster's (3 with
    #: ``agentstream dev up --brokers 3``); ``AGENTSTREAM_REPLICATION_FACTOR`` sets it for a cluster of one's own.
    replication_factor: int = 1
    #: A Confluent-compatible schema registry; None means the local registry built from schemas/.
    schema_registry_url: str | None = None
    #: The ``*.avsc`` files this process writes with (default: the ones shipped in the package). For
    #: upgrades and tests: a process started with a newer schemas directory writes a newer version of an
    #: event, as a newer release would (docs/upgrades.md).
    schemas_dir: Path | None = None
    #: How long the group waits for a silent member (a killed worker) before moving its partitions.
    session_timeout_ms: int = 10_000
    #: How long a Kafka request may go unanswered before the client gives up on that connection and
    #: looks for the partition's leader again (producers, service consumers, the client's outcome
    #: watcher). A broker that hangs (host frozen, network partition) answers nothing and resets
    #: nothing: until this expires, what was sent to it waits, even after its partitions moved
    #: (bench/chaos/broker_failure.py, docs/operations.md). aiokafka's defaults are 30 s / 40 s.
    kafka_request_timeout_ms: int = 10_000
    #: How long a service consumer's fetch waits for new records. aiokafka keeps one fetch in flight per
    #: broker, and a partition just drained waits for it to return: this bounds that wait (a hop's tail
    #: latency) against idle fetch requests (docs/benchmarks.md).
    fetch_max_wait_ms: int = 100
    #: The largest event agentstream puts on a topic, encoded. Kafka refuses records over the broker's
    #: ``message.max.bytes`` (1 MiB by default): a larger event's body goes to PostgreSQL and the topic
    #: carries a claim check (streams/kafka/claims.py); a larger dead letter is truncated, with a digest.
    max_event_bytes: int = 512 * 1024
    #: A running run's state goes to the compacted ``agent.runs`` topic at most once per this interval
    #: (its final state, and one awaiting approval, at once); 0: after every transition. The topic is for reading the
    #: latest state of runs; a transition's own record is the ``events`` and ``steps`` rows, and every
    #: snapshot held back was a record to encode, append, replicate and compact (docs/benchmarks.md).
    snapshot_interval_ms: int = 1000
    #: A run whose pending step shows no progress for this long is re-driven by the planner's sweeper
    #: (its request republished with the same ids).
    step_timeout_s: float = 60.0
    #: No run lasts longer than this after it started, with or without a deadline.
    max_run_s: float = 3600.0
    #: The most tool calls one model reply may ask for at once (they run side by side; a reply with more
    #: is refused like an invalid action). 1: one call per reply, as before parallel calls.
    max_parallel_tool_calls: int = 8
    #: How deep a tree of sub-agents may grow: a run at this depth is not offered the agents it could call
    #: (``AGENTSTREAM_MAX_AGENT_DEPTH``, default 3: a run, its children and grandchildren, and theirs).
    max_agent_depth: int = 3
    #: How a task that does not say calls tools (``TaskSubmitted.tool_calling``): ``json`` actions (every
    #: backend's default: small models do better with them) or ``native`` (the engine's own tool calling,
    #: for a model and server that support it; docs/architecture.md, "Inference").
    tool_calling: str = "json"
    #: Tracing, metrics and health endpoints (all off unless configured).
    telemetry: TelemetrySettings = field(default_factory=TelemetrySettings)
    #: How this process authenticates to Kafka (``identity.load_kafka_auth``): unauthenticated PLAINTEXT
    #: unless configured or the local stack runs with ``--secure``.
    kafka_auth: KafkaAuth = field(default_factory=KafkaAuth)
    #: Who this process is (its Kafka principal and database login on the local secure stack), as given to
    #: ``load``: ``kafka_auth`` and ``database_url`` were resolved from it.
    identity: Identity = CLIENT
    #: Whose word the planner takes for an approval: ``open``, any ApprovalDecided on the tasks topic
    #: (whoever may write it); ``recorded``, only a decision an approver's own database login recorded
    #: (``agentstream_decide``, docs/security.md). ``dev up --secure`` records ``recorded``.
    approvals: ApprovalMode = "open"
    #: Limits on this pipeline's runs — a tenant's, for a tenant's cell (docs/security.md, "Tenants").
    quotas: Quotas = field(default_factory=Quotas)
    #: What a run's model steps generate when its task does not say, and the bounds on what it may say.
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    #: Conversations: the transcript's token budget and what happens to the oldest turns beyond it.
    sessions: SessionSettings = field(default_factory=SessionSettings)

    def __repr__(self) -> str:
        return masked_repr(self)

    def kafka_options(self) -> dict[str, Any]:
        """``bootstrap_servers`` and this process's security options, for any aiokafka client."""
        return kafka_options(self.kafka_bootstrap, self.kafka_auth)

    @classmethod
    def load(cls, paths: StackPaths | None = None, *, identity: Identity = CLIENT) -> Settings:
        """Resolve settings from the environment, then the dev stack's state file, then defaults; on the
        local secure stack, with ``identity``'s Kafka principal and database login (default: the client)."""
        paths = paths or StackPaths.from_env()
        recorded = read_state(paths.state_file)
        env_kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
        env_db = env_database_url()  # (its password from AGENTSTREAM_DATABASE_PASSWORD_FILE, if set)
        tenant = env.tenant()
        return cls(
            kafka_bootstrap=env_kafka
            or recorded.get("kafka")
            or f"127.0.0.1:{DEFAULT_KAFKA_PORT}",
            database_url=env_db
            or login_url(recorded, identity)
            or recorded.get("database_url")
            or f"postgresql://postgres@127.0.0.1:{DEFAULT_POSTGRES_PORT}/{DEFAULT_DATABASE}",
            external_kafka=bool(env_kafka),
            external_database=bool(env_db),
            paths=paths,
            topic_prefix=os.environ.get("AGENTSTREAM_TOPIC_PREFIX", "") or (f"{tenant}." if tenant else ""),
            partitions=env.positive_int("AGENTSTREAM_PARTITIONS", 8),
            replication_factor=env.positive_int("AGENTSTREAM_REPLICATION_FACTOR",
                                                1 if env_kafka else min(3, int(recorded.get("kafka_brokers") or 1))),
            schema_registry_url=os.environ.get("AGENTSTREAM_SCHEMA_REGISTRY_URL") or None,
            schemas_dir=env.directory("AGENTSTREAM_SCHEMAS_DIR"),
            session_timeout_ms=env.positive_int("AGENTSTREAM_SESSION_TIMEOUT_MS", 10_000),
            fetch_max_wait_ms=env.positive_int("AGENTSTREAM_FETCH_MAX_WAIT_MS", 100),
            kafka_request_timeout_ms=env.positive_int("AGENTSTREAM_KAFKA_REQUEST_TIMEOUT_MS", 10_000),
            max_event_bytes=env.positive_int("AGENTSTREAM_MAX_EVENT_BYTES", 512 * 1024),
            snapshot_interval_ms=env.non_negative_int("AGENTSTREAM_SNAPSHOT_INTERVAL_MS", 1000),
            step_timeout_s=env.positive_float("AGENTSTREAM_STEP_TIMEOUT_S", 60.0),
            max_run_s=env.positive_float("AGENTSTREAM_MAX_RUN_S", 3600.0),
            max_parallel_tool_calls=env.positive_int("AGENTSTREAM_MAX_PARALLEL_TOOL_CALLS", 8),
            max_agent_depth=env.positive_int("AGENTSTREAM_MAX_AGENT_DEPTH", 3),
            tool_calling=_tool_calling(),
            telemetry=TelemetrySettings.load(paths),
            kafka_auth=load_kafka_auth(recorded, identity=identity, external=bool(env_kafka)),
            identity=identity,
            approvals=_approvals(recorded),
            quotas=Quotas.load(),
            generation=GenerationSettings.load(),
            sessions=SessionSettings.load(),
        )


def _tool_calling() -> str:
    raw = os.environ.get("AGENTSTREAM_TOOL_CALLING", "").strip().lower() or "json"
    if raw not in ("json", "native"):
        raise ConfigError(f"AGENTSTREAM_TOOL_CALLING={raw!r} must be json or native")
    return raw


def _approvals(recorded: dict[str, Any]) -> ApprovalMode:
    raw = os.environ.get("AGENTSTREAM_APPROVALS", "").strip().lower() or str(recorded.get("approvals") or "open")
    mode = one_of(raw, APPROVAL_MODES)
    if mode is None:
        raise ConfigError(f"AGENTSTREAM_APPROVALS={raw!r} must be one of {', '.join(APPROVAL_MODES)}")
    return mode
