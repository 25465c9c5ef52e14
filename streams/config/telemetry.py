"""Tracing, metrics and health endpoints: ``TelemetrySettings`` (all off unless configured)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agentstream.streams.config import env
from agentstream.streams.config.masking import masked_repr
from agentstream.streams.config.stack_state import StackPaths
from agentstream.streams.core.errors import ConfigError
from agentstream.streams.core.kinds import TRACING_MODES, TracingMode, one_of


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
            sample=env.fraction("AGENTSTREAM_TRACE_SAMPLE", 1.0),
            metrics_port=port,
            metrics_host=os.environ.get("AGENTSTREAM_METRICS_HOST", "").strip() or "127.0.0.1",
            metrics_advertise=os.environ.get("AGENTSTREAM_METRICS_ADVERTISE", "").strip() or None,
            sample_interval_s=env.positive_float("AGENTSTREAM_TELEMETRY_INTERVAL_S", 5.0),
            service_name=os.environ.get("OTEL_SERVICE_NAME", "").strip() or "agentstream",
        )
