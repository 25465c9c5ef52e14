"""Settings: the only module that reads the environment.

Where a setting comes from, first match wins:

1. the environment (``KAFKA_BOOTSTRAP_SERVERS``, ``DATABASE_URL``, ``AGENTSTREAM_*``): a user's own
   cluster and database;
2. the state file that ``agentstream dev up`` writes (``<state dir>/stack.json``): the local stack;
3. the defaults of the local stack (loopback ports below).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentstream.streams.config.kafka_auth import DEFAULT_MECHANISM, KafkaAuth
from agentstream.streams.core import resources
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.kinds import APPROVAL_MODES, TRACING_MODES, ApprovalMode, TracingMode, one_of

DEFAULT_KAFKA_PORT = 39092
DEFAULT_POSTGRES_PORT = 35432
DEFAULT_DATABASE = "agentstream"


def _home_dir(env_name: str, xdg_name: str, fallback: str) -> Path:
    explicit = os.environ.get(env_name)
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get(xdg_name)
    root = Path(base).expanduser() if base else Path.home() / fallback
    return (root / "agentstream").resolve()


@dataclass(frozen=True, kw_only=True)
class StackPaths:
    """Where the local stack keeps what it downloads (cache) and what it runs (state)."""

    cache_dir: Path
    state_dir: Path
    infra_dir: Path

    @property
    def state_file(self) -> Path:
        return self.state_dir / "stack.json"

    @classmethod
    def from_env(cls) -> StackPaths:
        infra = os.environ.get("AGENTSTREAM_INFRA_DIR")
        return cls(
            cache_dir=_home_dir("AGENTSTREAM_CACHE_DIR", "XDG_CACHE_HOME", ".cache"),
            state_dir=_home_dir("AGENTSTREAM_STATE_DIR", "XDG_STATE_HOME", ".local/state"),
            infra_dir=Path(infra).resolve() if infra else resources.infra_dir(),
        )


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
    #: (bench/broker_failure.py, docs/operations.md). aiokafka's defaults are 30 s / 40 s.
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
    #: Tracing, metrics and health endpoints (all off unless configured).
    telemetry: TelemetrySettings = field(default_factory=lambda: TelemetrySettings())
    #: How this process authenticates to Kafka (``load_kafka_auth``): unauthenticated PLAINTEXT unless
    #: configured or the local stack runs with ``--secure``.
    kafka_auth: KafkaAuth = field(default_factory=KafkaAuth)
    #: Whose word the planner takes for an approval: ``open``, any ApprovalDecided on the tasks topic
    #: (whoever may write it); ``recorded``, only a decision an approver's own database login recorded
    #: (``agentstream_decide``, docs/security.md). ``dev up --secure`` records ``recorded``.
    approvals: ApprovalMode = "open"
    #: Limits on this pipeline's runs — a tenant's, for a tenant's cell (docs/security.md, "Tenants").
    quotas: Quotas = field(default_factory=lambda: Quotas())

    def __repr__(self) -> str:
        return masked_repr(self)

    def kafka_options(self) -> dict[str, Any]:
        """``bootstrap_servers`` and this process's security options, for any aiokafka client."""
        return {"bootstrap_servers": self.kafka_bootstrap, **self.kafka_auth.options()}

    @classmethod
    def load(cls, paths: StackPaths | None = None) -> Settings:
        """Resolve settings from the environment, then the dev stack's state file, then defaults."""
        paths = paths or StackPaths.from_env()
        recorded = read_state(paths.state_file)
        env_kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
        env_db = os.environ.get("DATABASE_URL", "").strip()
        return cls(
            kafka_bootstrap=env_kafka
            or recorded.get("kafka")
            or f"127.0.0.1:{DEFAULT_KAFKA_PORT}",
            database_url=env_db
            or _login_url(recorded)
            or recorded.get("database_url")
            or f"postgresql://postgres@127.0.0.1:{DEFAULT_POSTGRES_PORT}/{DEFAULT_DATABASE}",
            external_kafka=bool(env_kafka),
            external_database=bool(env_db),
            paths=paths,
            topic_prefix=os.environ.get("AGENTSTREAM_TOPIC_PREFIX", "") or (f"{_tenant()}." if _tenant() else ""),
            partitions=_positive_int("AGENTSTREAM_PARTITIONS", 8),
            replication_factor=_positive_int("AGENTSTREAM_REPLICATION_FACTOR",
                                             1 if env_kafka else min(3, int(recorded.get("kafka_brokers") or 1))),
            schema_registry_url=os.environ.get("AGENTSTREAM_SCHEMA_REGISTRY_URL") or None,
            schemas_dir=_directory("AGENTSTREAM_SCHEMAS_DIR"),
            session_timeout_ms=_positive_int("AGENTSTREAM_SESSION_TIMEOUT_MS", 10_000),
            fetch_max_wait_ms=_positive_int("AGENTSTREAM_FETCH_MAX_WAIT_MS", 100),
            kafka_request_timeout_ms=_positive_int("AGENTSTREAM_KAFKA_REQUEST_TIMEOUT_MS", 10_000),
            max_event_bytes=_positive_int("AGENTSTREAM_MAX_EVENT_BYTES", 512 * 1024),
            snapshot_interval_ms=_non_negative_int("AGENTSTREAM_SNAPSHOT_INTERVAL_MS", 1000),
            step_timeout_s=_positive_float("AGENTSTREAM_STEP_TIMEOUT_S", 60.0),
            max_run_s=_positive_float("AGENTSTREAM_MAX_RUN_S", 3600.0),
            telemetry=TelemetrySettings.load(paths),
            kafka_auth=load_kafka_auth(recorded, external=bool(env_kafka)),
            approvals=_approvals(recorded),
            quotas=Quotas.load(),
        )


@dataclass(frozen=True, kw_only=True)
class TelemetrySettings:
    """Tracing and metrics. Everything is off by default, so a worker that nobody observes pays nothing.

    - ``tracing``: ``off`` (no spans; the ``traceparent`` header is still carried), ``file`` (JSON lines
      to ``trace_file``, for local debugging) or ``otlp`` (OTLP over HTTP/protobuf to ``otlp_endpoint``);
    - ``sample``: the fraction of runs traced (``ParentBased(TraceIdRatio)``: decided once, at submit);
    - ``metrics_port``: where ``/metrics``, ``/healthz`` and ``/readyz`` are served; None is off, 0 any
      free port (registered in PostgreSQL, so ``agentstream top`` still finds it).
    """

    tracing: TracingMode = "off"
    trace_file: Path | None = None
    otlp_endpoint: str = "http://localhost:4318/v1/traces"
    sample: float = 1.0
    metrics_port: int | None = None
    #: Loopback unless configured: ``/metrics`` says what a worker does and ``/readyz`` why it waits, which
    #: is no one else's business on a shared host. Containers and pods set ``0.0.0.0`` (their own network
    #: namespace; the kubelet and Prometheus come in through the pod's address): the Containerfile and
    #: ``agentstream deploy render`` do.
    metrics_host: str = "127.0.0.1"
    #: The host name other machines reach this worker's metrics at (default: this host's name).
    metrics_advertise: str | None = None
    #: How often consumer lag and the inference backlog are sampled (never per message).
    sample_interval_s: float = 5.0
    service_name: str = "agentstream"

    def __repr__(self) -> str:
        return masked_repr(self)

    @property
    def tracing_enabled(self) -> bool:
        return self.tracing != "off"

    def trace_path(self, paths: StackPaths | None = None) -> Path:
        return self.trace_file or (paths or StackPaths.from_env()).state_dir / "traces.jsonl"

    @classmethod
    def load(cls, paths: StackPaths | None = None) -> TelemetrySettings:
        """``AGENTSTREAM_TRACING``, ``AGENTSTREAM_TRACE_FILE``, ``AGENTSTREAM_TRACE_SAMPLE``,
        ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``,
        ``AGENTSTREAM_METRICS_PORT`` / ``_HOST`` / ``_ADVERTISE``, ``AGENTSTREAM_TELEMETRY_INTERVAL_S``."""
        raw = os.environ.get("AGENTSTREAM_TRACING", "off").strip().lower() or "off"
        mode = one_of(raw, TRACING_MODES)
        if mode is None:
            raise ConfigError(f"AGENTSTREAM_TRACING={raw!r} must be one of {', '.join(TRACING_MODES)}")
        file = os.environ.get("AGENTSTREAM_TRACE_FILE", "").strip()
        endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        if not endpoint:
            base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
            endpoint = base.rstrip("/") + "/v1/traces" if base else "http://localhost:4318/v1/traces"
        port_raw = os.environ.get("AGENTSTREAM_METRICS_PORT", "").strip().lower()
        port: int | None = None
        if port_raw not in ("", "off", "none"):
            if not port_raw.isdigit() or int(port_raw) > 65535:
                raise ConfigError(f"AGENTSTREAM_METRICS_PORT={port_raw!r} is not a TCP port number (0: any free port)")
            port = int(port_raw)
        return cls(
            tracing=mode,
            trace_file=Path(file).expanduser() if file else (paths.state_dir / "traces.jsonl" if paths else None),
            otlp_endpoint=endpoint,
            sample=_fraction("AGENTSTREAM_TRACE_SAMPLE", 1.0),
            metrics_port=port,
            metrics_host=os.environ.get("AGENTSTREAM_METRICS_HOST", "").strip() or "127.0.0.1",
            metrics_advertise=os.environ.get("AGENTSTREAM_METRICS_ADVERTISE", "").strip() or None,
            sample_interval_s=_positive_float("AGENTSTREAM_TELEMETRY_INTERVAL_S", 5.0),
            service_name=os.environ.get("OTEL_SERVICE_NAME", "").strip() or "agentstream",
        )


@dataclass(frozen=True, kw_only=True)
class AlertSettings:
    """Thresholds of the alerting app (services/alerts). Durations in seconds."""

    #: A model step ("thinking time": InferenceCompleted.duration_ms) slower than this raises slow_model_step.
    model_step_s: float = 30.0
    #: A tool call slower than its threshold raises slow_tool; per-tool overrides by name.
    tool_slow_s: float = 10.0
    tool_slow_overrides: dict[str, float] = field(default_factory=dict)
    #: Failed calls / calls of one tool over a window at or above this (with at least min_calls) alert.
    tool_failure_rate: float = 0.5
    tool_min_calls: int = 5
    #: Tumbling window of the rate and slow-call aggregations (one alert per kind, subject and window).
    window_s: float = 60.0
    #: Records a consumer group is behind (committed versus end offsets, per topic) before consumer_lag.
    lag_records: int = 1000
    lag_interval_s: float = 15.0
    #: Results older than this when the app reads them (a restart, a backlog) do not alert.
    max_age_s: float = 300.0

    def tool_threshold_s(self, tool: str) -> float:
        return self.tool_slow_overrides.get(tool, self.tool_slow_s)

    @classmethod
    def load(cls) -> AlertSettings:
        """``AGENTSTREAM_ALERT_*``; ``AGENTSTREAM_ALERT_TOOL_SLOW_S`` is a default and per-tool overrides:
        ``10,http_get=5,sql_query=2``."""
        default, overrides = _threshold_spec("AGENTSTREAM_ALERT_TOOL_SLOW_S", 10.0)
        return cls(
            model_step_s=_positive_float("AGENTSTREAM_ALERT_MODEL_STEP_S", 30.0),
            tool_slow_s=default, tool_slow_overrides=overrides,
            tool_failure_rate=_fraction("AGENTSTREAM_ALERT_TOOL_FAILURE_RATE", 0.5),
            tool_min_calls=_positive_int("AGENTSTREAM_ALERT_TOOL_MIN_CALLS", 5),
            window_s=_positive_float("AGENTSTREAM_ALERT_WINDOW_S", 60.0),
            lag_records=_positive_int("AGENTSTREAM_ALERT_LAG", 1000),
            lag_interval_s=_positive_float("AGENTSTREAM_ALERT_LAG_INTERVAL_S", 15.0),
            max_age_s=_positive_float("AGENTSTREAM_ALERT_MAX_AGE_S", 300.0),
        )


@dataclass(frozen=True, kw_only=True)
class Quotas:
    """What one pipeline (a tenant's cell) may use; None is no limit. Enforced by its planners: a task over
    a limit fails with ``quota_exceeded`` and the reason. ``runs_in_flight`` is counted in PostgreSQL when a
    task arrives, so planners taking tasks at the same moment can overshoot it by a few runs."""

    runs_in_flight: int | None = None
    max_steps: int | None = None
    tokens_per_run: int | None = None

    @classmethod
    def load(cls) -> Quotas:
        """``AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT``, ``AGENTSTREAM_QUOTA_MAX_STEPS``,
        ``AGENTSTREAM_QUOTA_TOKENS_PER_RUN`` (prompt + completion tokens of one run)."""
        return cls(runs_in_flight=_optional_positive_int("AGENTSTREAM_QUOTA_RUNS_IN_FLIGHT"),
                   max_steps=_optional_positive_int("AGENTSTREAM_QUOTA_MAX_STEPS"),
                   tokens_per_run=_optional_positive_int("AGENTSTREAM_QUOTA_TOKENS_PER_RUN"))


@dataclass(frozen=True, kw_only=True)
class TrtLlmSettings:
    """The TensorRT-LLM backend's sequence limits (``agentstream worker inference --backend trtllm``;
    its command-line options win over these). None keeps the engine's own default: ``max_seq_len`` the
    model's context length, ``max_num_tokens`` TensorRT-LLM's per-step budget. Chunked prefill is on unless
    turned off: without it a prompt longer than ``max_num_tokens`` is refused, and an agent's conversation
    grows past that step after step (docs/gpu.md says what each costs)."""

    max_seq_len: int | None = None
    max_num_tokens: int | None = None
    chunked_prefill: bool = True

    @classmethod
    def load(cls) -> TrtLlmSettings:
        """``AGENTSTREAM_TRTLLM_MAX_SEQ_LEN``, ``AGENTSTREAM_TRTLLM_MAX_NUM_TOKENS``,
        ``AGENTSTREAM_TRTLLM_CHUNKED_PREFILL`` (``0``/``off`` turns it off)."""
        return cls(max_seq_len=_optional_positive_int("AGENTSTREAM_TRTLLM_MAX_SEQ_LEN"),
                   max_num_tokens=_optional_positive_int("AGENTSTREAM_TRTLLM_MAX_NUM_TOKENS"),
                   chunked_prefill=_flag("AGENTSTREAM_TRTLLM_CHUNKED_PREFILL", True))

    def backend_options(self) -> dict[str, Any]:
        """Keyword arguments for ``TrtLlmBackend``: only what is set, so the backend's defaults stay its own."""
        options: dict[str, Any] = {"enable_chunked_prefill": self.chunked_prefill}
        if self.max_seq_len is not None:
            options["max_seq_len"] = self.max_seq_len
        if self.max_num_tokens is not None:
            options["max_num_tokens"] = self.max_num_tokens
        return options


def _float_env(name: str, default: float, ok: Callable[[float], bool], must: str) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")  # fails every check
    if not ok(value):
        raise ConfigError(f"{name}={raw!r} must be {must}")
    return value


def _positive_float(name: str, default: float) -> float:
    return _float_env(name, default, lambda v: v > 0, "a positive number")


def _fraction(name: str, default: float) -> float:
    return _float_env(name, default, lambda v: 0.0 <= v <= 1.0, "a number between 0 and 1")


def _threshold_spec(name: str, default: float) -> tuple[float, dict[str, float]]:
    """``"10,http_get=5"`` → (10.0, {"http_get": 5.0}); a part without ``=`` is the default."""
    raw = os.environ.get(name, "").strip()
    overrides: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        key, eq, value = part.partition("=")
        try:
            number = float(value if eq else key)
        except ValueError:
            number = -1.0
        if not number > 0:
            raise ConfigError(f"{name}: {part!r} must be SECONDS or TOOL=SECONDS with a positive number")
        if eq:
            overrides[key.strip()] = number
        else:
            default = number
    return default, overrides


def _directory(name: str) -> Path | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser().resolve()
    if not path.is_dir():
        raise ConfigError(f"{name}={raw!r} is not a directory")
    return path


def _positive_int(name: str, default: int) -> int:
    return _whole_number(name, default, minimum=1)


def _non_negative_int(name: str, default: int) -> int:
    return _whole_number(name, default, minimum=0)


def _whole_number(name: str, default: int, *, minimum: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < minimum:
        wanted = "a positive integer" if minimum == 1 else f"a whole number, {minimum} or more"
        raise ConfigError(f"{name}={raw!r} must be {wanted}")
    return int(raw)


#: The principal this process is on the local secure stack (``use_kafka_principal``): a worker is its
#: service, anything else the client.
_process_principal = "client"
#: Its PostgreSQL login there (``use_database_login``); None: the principal's own login where it has one
#: (``_OWN_LOGINS``: each service, ``worker`` and the client), else the schema owner's.
_database_login: str | None = None
_OWN_LOGINS = ("client", "planner", "tools", "retrieval", "inference", "worker")


def _approvals(recorded: dict[str, Any]) -> ApprovalMode:
    raw = os.environ.get("AGENTSTREAM_APPROVALS", "").strip().lower() or str(recorded.get("approvals") or "open")
    mode = one_of(raw, APPROVAL_MODES)
    if mode is None:
        raise ConfigError(f"AGENTSTREAM_APPROVALS={raw!r} must be one of {', '.join(APPROVAL_MODES)}")
    return mode


def use_database_login(login: str | None) -> None:
    """Make this process connect to the local secure stack's PostgreSQL as ``login`` (``agentstream
    approve`` is the ``approver``; None: as its principal implies). A ``DATABASE_URL`` in the
    environment still wins."""
    global _database_login
    _database_login = login


def _login_url(recorded: dict[str, Any]) -> str | None:
    """On the local secure stack: the recorded (owner's) URL with this process's own login instead,
    when it has one (a service's has only its tables, the client's is read-only)."""
    login = _database_login or (_principal() if _process_principal in _OWN_LOGINS else None)
    if login == "approver" and _tenant():
        login = f"approver-{_tenant()}"  # a tenant's approver decides on its own tenant's runs only
    owner, secrets = recorded.get("database_url"), recorded.get("secrets_dir")
    if not (login and owner and secrets):
        return None
    password = _read_secret(Path(secrets) / f"db-{login}.password", f"the local stack's database login {login}")
    parts = urlsplit(owner)
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    netloc = f"{login}:{password}@{host}"
    return str(urlunsplit(parts._replace(netloc=netloc)))


def _tenant() -> str:
    """``AGENTSTREAM_TENANT``: the tenant this process works for (docs/security.md, "Tenants")."""
    return os.environ.get("AGENTSTREAM_TENANT", "").strip()


def _principal() -> str:
    """This process's principal on the local secure stack: a tenant's client is the tenant's own."""
    if _process_principal == "client" and _tenant():
        return f"tenant-{_tenant()}"
    return _process_principal


def use_kafka_principal(name: str) -> None:
    """Make this process authenticate as ``name`` on the local stack (``agentstream worker planner`` is
    the planner). An ``AGENTSTREAM_KAFKA_USERNAME`` in the environment still wins."""
    global _process_principal
    _process_principal = name


def process_kafka_auth() -> KafkaAuth:
    """This process's Kafka principal, for code that is handed only a bootstrap address."""
    paths = StackPaths.from_env()
    return load_kafka_auth(read_state(paths.state_file), external=bool(os.environ.get("KAFKA_BOOTSTRAP_SERVERS")))


def load_kafka_auth(recorded: dict[str, Any], *, external: bool = False) -> KafkaAuth:
    """``AGENTSTREAM_KAFKA_SECURITY_PROTOCOL`` (PLAINTEXT, SASL_PLAINTEXT, SASL_SSL),
    ``AGENTSTREAM_KAFKA_SASL_MECHANISM`` (SCRAM-SHA-512 by default), ``AGENTSTREAM_KAFKA_USERNAME`` and
    the password from ``AGENTSTREAM_KAFKA_PASSWORD_FILE`` (or ``AGENTSTREAM_KAFKA_PASSWORD``),
    ``AGENTSTREAM_KAFKA_SSL_CAFILE``. Without them, on the local stack started with ``--secure`` (its
    state file records ``kafka_security`` and ``secrets_dir``): this process's principal
    (``use_kafka_principal``) with its password file there."""
    protocol = os.environ.get("AGENTSTREAM_KAFKA_SECURITY_PROTOCOL", "").strip().upper()
    username = os.environ.get("AGENTSTREAM_KAFKA_USERNAME", "").strip() or None
    password_file = os.environ.get("AGENTSTREAM_KAFKA_PASSWORD_FILE", "").strip()
    password = os.environ.get("AGENTSTREAM_KAFKA_PASSWORD") or None
    secrets = recorded.get("secrets_dir") if not external else None
    if not protocol:  # a user name alone means SASL; else the local stack's own, else none
        protocol = "SASL_PLAINTEXT" if username else str((secrets and recorded.get("kafka_security")) or "PLAINTEXT")
    if protocol != "PLAINTEXT" and not username and secrets:
        username = _principal()
    if password_file:
        password = _read_secret(Path(password_file).expanduser(), "AGENTSTREAM_KAFKA_PASSWORD_FILE")
    elif password is None and username and secrets:
        password = _read_secret(Path(secrets) / f"{username}.password", f"the local stack's secret of {username}")
    cafile = os.environ.get("AGENTSTREAM_KAFKA_SSL_CAFILE", "").strip()
    return KafkaAuth(security_protocol=protocol,
                     sasl_mechanism=os.environ.get("AGENTSTREAM_KAFKA_SASL_MECHANISM", "").strip().upper()
                     or DEFAULT_MECHANISM,
                     username=username, password=password, ssl_cafile=Path(cafile) if cafile else None)


def _read_secret(path: Path, what: str) -> str:
    try:
        secret = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} ({path}): {exc.strerror or exc}") from None
    if not secret:
        raise ConfigError(f"{what} ({path}) is empty")
    return secret


def _optional_positive_int(name: str) -> int | None:
    return _positive_int(name, 0) or None


_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in _FLAGS:
        raise ConfigError(f"{name}={raw!r} must be one of {', '.join(_FLAGS)}")
    return _FLAGS[raw]


def dev_ports() -> tuple[int | None, int | None]:
    """Ports asked for the local stack by ``AGENTSTREAM_KAFKA_PORT`` / ``AGENTSTREAM_PG_PORT``."""

    def port(name: str) -> int | None:
        raw = os.environ.get(name, "").strip()
        if not raw:
            return None
        if not raw.isdigit() or not 0 < int(raw) < 65536:
            raise ConfigError(f"{name}={raw!r} is not a TCP port number")
        return int(raw)

    return port("AGENTSTREAM_KAFKA_PORT"), port("AGENTSTREAM_PG_PORT")


def model_api_key() -> str | None:
    """The API key for an OpenAI-compatible model server: ``AGENTSTREAM_MODEL_API_KEY``, else
    ``OPENAI_API_KEY``."""
    return os.environ.get("AGENTSTREAM_MODEL_API_KEY") or os.environ.get("OPENAI_API_KEY") or None


def tool_environment() -> dict[str, str]:
    """The ``AGENTSTREAM_HTTP_*`` / ``AGENTSTREAM_SQL_*`` / ``AGENTSTREAM_BUILTIN_TOOLS_VERSION`` variables
    that configure the built-in tools (parsed by ``agentstream.services.tools.builtin.BuiltinConfig.from_env``)."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(("AGENTSTREAM_HTTP_", "AGENTSTREAM_SQL_")) or k == "AGENTSTREAM_BUILTIN_TOOLS_VERSION"}


def embedding_files() -> tuple[str | None, str | None]:
    """Paths overriding the embedding model and tokenizer (``AGENTSTREAM_EMBEDDING_MODEL`` /
    ``AGENTSTREAM_EMBEDDING_TOKENIZER``); they must still match the pinned checksums."""
    return (os.environ.get("AGENTSTREAM_EMBEDDING_MODEL") or None,
            os.environ.get("AGENTSTREAM_EMBEDDING_TOKENIZER") or None)


def uvloop_enabled() -> bool:
    """uvloop runs the workers' event loops unless ``AGENTSTREAM_UVLOOP=0``."""
    return os.environ.get("AGENTSTREAM_UVLOOP", "1").strip().lower() not in ("0", "false", "no", "off")


def write_state(state_file: Path, state: dict[str, Any]) -> None:
    """Replace the dev stack's state file atomically, readable by its owner only (0600): it holds the
    ``DATABASE_URL`` with its password, which nothing prints (``mask_url``)."""
    tmp = state_file.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)  # a leftover could have wider permissions; O_CREAT keeps an existing file's
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, state_file)


def read_state(state_file: Path) -> dict[str, Any]:
    """The dev stack's recorded state, or ``{}`` when it has never been started (or the file is not a
    JSON object)."""
    try:
        state = json.loads(state_file.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


# -- secrets in what is printed -------------------------------------------------------------------

MASK = "***"
_SCHEME = re.compile(r"(?:^|(?<=,))[A-Za-z][A-Za-z0-9+.\-_]*://")  # _: Kafka listeners (SASL_SSL://)
_SECRET_PARAM = re.compile(r"(?i)(?<![A-Za-z0-9_.])([A-Za-z0-9_.]*(?:password|passwd|secret|token)[A-Za-z0-9_.]*)=([^&;\s,]*)")


def mask_url(value: str) -> str:
    """``value`` (a URL, or a comma-separated list of them such as Kafka bootstrap servers) with every
    password replaced by ``***``: what is printed or logged instead of a connection string.

    ``postgresql://user:secret@host/db`` becomes ``postgresql://user:***@host/db``; the user, host, port
    and database stay (they say where, and are not secret). The user information ends at the *last*
    ``@`` before the query, so a password with a raw ``@`` or ``/`` is masked whole; query parameters
    named like a secret (``?password=``, ``sslpassword=``, ``sasl.password=``, ``token=``) are masked
    too. A URL without a password comes back unchanged."""
    return "".join(_mask_token(part) if part and not part.isspace() else part for part in re.split(r"(\s+)", value))


def _mask_token(token: str) -> str:
    starts = [m.start() for m in _SCHEME.finditer(token)]
    if starts:  # one or more URLs: each runs to the next one's scheme (multi-host DSNs keep their commas)
        bounds = sorted({0, *starts, len(token)})
        return "".join(_mask_one(token[a:b]) for a, b in itertools.pairwise(bounds))
    return ",".join(_mask_one(item) for item in token.split(","))  # host:port lists without a scheme


def _mask_one(url: str) -> str:
    match = _SCHEME.match(url)
    head, rest = (url[: match.end()], url[match.end():]) if match else ("", url)
    query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, query_at)
    if at < 0 and "@" in rest and "/" not in rest[: rest.index("@")]:
        at = rest.index("@")  # a raw ? or # in the password: the first @ still ends the user information
    if at >= 0 and ":" in rest[:at]:
        rest = f"{rest[: rest.index(':')]}:{MASK}{rest[at:]}"
        query_at = min((i for i in (rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    if not match and at < 0:
        query_at = 0  # not a URL: a libpq ``key=value`` word such as ``password=…``
    return head + rest[:query_at] + _SECRET_PARAM.sub(lambda m: f"{m.group(1)}={MASK}", rest[query_at:])


def masked_repr(obj: Any) -> str:
    """A dataclass's repr with ``mask_url`` applied to its text fields: settings and statuses carry
    connection strings, and a repr ends up in logs and tracebacks."""
    parts = []
    for f in dataclasses.fields(obj):
        if f.repr:
            value = getattr(obj, f.name)
            parts.append(f"{f.name}={mask_url(value)!r}" if isinstance(value, str) else f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"
