"""OpenTelemetry tracing: one span per handled record, one trace per run.

- The client's ``submit`` starts the run's root span (``agentstream.streams.telemetry.trace_context.new_traceparent`` calls
  ``Tracing.root_traceparent`` through a hook); ``Runtime.send`` adds the run id and ends it when the
  broker acknowledged the task.
- The runtime starts one span per record a service handles, named ``"{service} {EventType}"``, whose
  parent is the ``traceparent`` header of that record, and writes that span's context into the header
  of every event the handler emits: each service span's parent is the span that produced its input.
- Sampling is ``ParentBased(TraceIdRatio(sample))``: decided once per run, at the root, and followed by
  every service (the header's sampled flag), so a run is traced whole or not at all.
- The per-record spans (and a tool's execution inside one) are ``RecordSpan``s: the SDK's data model
  and sampling without the SDK tracer's per-span cost (see the class); the client's root is an
  ordinary SDK span.
- Export: OTLP over HTTP/protobuf (the exporter is imported only when configured) or JSON lines to a
  file, from background threads (the event loop only queues finished spans).

Nothing here runs when tracing is off: the runtime keeps ``Tracing`` as ``None`` and carries the
header with ``agentstream.streams.telemetry.trace_context.child_of`` instead.
"""

from __future__ import annotations

import atexit
import logging
import random
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from agentstream.streams.config.stack_state import StackPaths
from agentstream.streams.config.telemetry import TelemetrySettings
from agentstream.streams.telemetry import trace_context as header

log = logging.getLogger(__name__)

_ROOT = otel_context.Context()  # an empty context: a span started in it is a root
_MAX_PENDING_ROOTS = 4096
_PENDING_ROOT_S = 60.0  # a root span not sent by then (a traceparent made but never published) just ends
_TRACE_ID_LIMIT = (1 << 64) - 1  # TraceIdRatioBased compares the low 64 bits of the trace id with its bound
_SCOPE = InstrumentationScope("agentstream")
_UNSET = Status(StatusCode.UNSET)


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The remote span context a ``traceparent`` header names (None when absent or malformed)."""
    if not value or len(value) != 55 or value[2] != "-" or value[35] != "-" or value[52] != "-":
        return None
    try:
        trace_id, span_id, flags = int(value[3:35], 16), int(value[36:52], 16), int(value[53:55], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))


def format_traceparent(ctx: SpanContext) -> str:
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


class RecordSpan:
    """The span of one handled record, recorded with the least work on the event loop.

    The SDK's ``Tracer.start_span`` costs about 45 µs a span (attribute validation, links, locks,
    sampler objects); at one span per record and every run traced, that was 8 % of the planner's CPU
    (py-spy, ``bench/perf/pipeline.py``). This keeps the ids, the times and a plain attribute dict (the
    runtime's attributes are known-good types), and becomes an SDK ``ReadableSpan`` only when exported,
    in the exporter's thread — or goes straight to the JSON-lines file. It follows the SDK's data model
    and sampling (``ParentBased(TraceIdRatio)``, the same bound), so mixed with SDK spans (the client's
    root) it forms one trace.
    """

    __slots__ = ("_tracing", "attributes", "context", "end_time", "kind", "name", "parent", "start_time", "status")

    def __init__(self, tracing: Tracing, name: str, context: SpanContext, parent: SpanContext | None,
                 attributes: dict[str, Any]) -> None:
        self._tracing = tracing
        self.name = name
        self.context = context
        self.parent = parent
        self.attributes = attributes
        self.kind = SpanKind.CONSUMER
        self.status = _UNSET
        self.start_time = time.time_ns()
        self.end_time: int | None = None

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_status(self, status: Status) -> None:
        self.status = status

    def end(self) -> None:
        if self.end_time is None:
            self.end_time = time.time_ns()
            self._tracing._finished(self)

    def readable(self, resource: Resource) -> ReadableSpan:
        return ReadableSpan(name=self.name, context=self.context, parent=self.parent, resource=resource,
                            attributes=self.attributes, kind=self.kind, status=self.status,
                            start_time=self.start_time, end_time=self.end_time, instrumentation_scope=_SCOPE)


class Tracing:
    """A tracer provider, its exporter, and the few operations the runtime needs — kept off the OTel
    global state so tests can run one of their own (``install``).

    ``batch``: export from a background thread (production); False exports as each span ends (tests).
    """

    def __init__(self, exporter: SpanExporter, *, sample: float = 1.0, service_name: str = "agentstream",
                 batch: bool = True) -> None:
        self.exporter = exporter
        self.resource = Resource.create({"service.name": service_name})
        self.provider = TracerProvider(resource=self.resource, sampler=ParentBased(TraceIdRatioBased(sample)))
        self.processor: SpanProcessor = (
            BatchSpanProcessor(exporter, max_queue_size=65536, max_export_batch_size=2048,
                               schedule_delay_millis=1000) if batch else SimpleSpanProcessor(exporter))
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("agentstream")
        self.service_name = service_name
        self._bound = TraceIdRatioBased.get_bound_for_rate(sample)
        self._direct = exporter if isinstance(exporter, JsonLinesSpanExporter) else None
        self._batch = batch
        self._finished_spans: deque[RecordSpan] = deque()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._pending_roots: OrderedDict[str, tuple[Span, float]] = OrderedDict()
        self._lock = threading.Lock()
        self._names: dict[tuple[str, str], str] = {}

    @classmethod
    def from_settings(cls, settings: TelemetrySettings, *, paths: StackPaths | None = None,
                      exporter: SpanExporter | None = None) -> Tracing | None:
        """The tracing ``settings`` ask for (None when off). ``exporter`` overrides the configured one."""
        if exporter is None:
            if not settings.tracing_enabled:
                return None
            if settings.tracing == "otlp":
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter = OTLPSpanExporter(endpoint=settings.otlp_endpoint, timeout=10)
            else:
                exporter = JsonLinesSpanExporter(settings.trace_path(paths))
        return cls(exporter, sample=settings.sample, service_name=settings.service_name)

    # -- the run's root span ---------------------------------------------------------------------
    def root_traceparent(self) -> str:
        """Start a run's root span; ``Runtime.send`` finishes it when the task is acknowledged."""
        span = self.tracer.start_span("submit", context=_ROOT, kind=SpanKind.PRODUCER)
        value = format_traceparent(span.get_span_context())
        now = time.monotonic()
        with self._lock:
            pending = self._pending_roots
            pending[value] = (span, now)
            while pending and (len(pending) > _MAX_PENDING_ROOTS
                               or next(iter(pending.values()))[1] < now - _PENDING_ROOT_S):
                pending.popitem(last=False)[1][0].end()  # created but never sent
        return value

    @property
    def has_pending_roots(self) -> bool:
        return bool(self._pending_roots)

    def claim_root(self, traceparent: str) -> Span | None:
        with self._lock:
            entry = self._pending_roots.pop(traceparent, None)
        return entry[0] if entry is not None else None

    # -- one span per handled record -------------------------------------------------------------
    def span_name(self, service: str, event_type: str) -> str:
        key = (service, event_type)
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = f"{service} {event_type}"
        return name

    def start_record_span(self, service: str, event_type: str, parent: str | None,
                          attributes: dict[str, Any]) -> tuple[RecordSpan | None, str]:
        """The span of handling one record, child of the record's ``traceparent``, and the traceparent
        the events it emits carry. The span is None when the run is not sampled: its parent says so
        (ParentBased), or, without a parent, the trace id falls outside the ratio — the traceparent then
        still carries the trace, unsampled, at a fraction of a span's cost."""
        remote = parse_traceparent(parent)
        span_id = random.getrandbits(64) or 1
        if remote is not None:
            trace_id, flags = remote.trace_id, remote.trace_flags
        else:
            trace_id = random.getrandbits(128) or 1
            flags = TraceFlags(TraceFlags.SAMPLED if trace_id & _TRACE_ID_LIMIT < self._bound else 0)
        out = f"00-{trace_id:032x}-{span_id:016x}-{int(flags):02x}"
        if not flags.sampled:
            return None, out
        context = SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags)
        return RecordSpan(self, self.span_name(service, event_type), context, remote, attributes), out

    def start_child(self, name: str, parent: Span | RecordSpan, attributes: dict[str, Any] | None = None,
                    ) -> RecordSpan:
        """An INTERNAL span inside a record's span (a tool's execution, for instance)."""
        ctx = parent.get_span_context()
        child = RecordSpan(self, name, SpanContext(ctx.trace_id, random.getrandbits(64) or 1, is_remote=False,
                                                   trace_flags=ctx.trace_flags), ctx, dict(attributes or {}))
        child.kind = SpanKind.INTERNAL
        return child

    @staticmethod
    def fail(span: Span | RecordSpan, description: str) -> None:
        span.set_status(Status(StatusCode.ERROR, description))

    # -- export ----------------------------------------------------------------------------------
    def _finished(self, span: RecordSpan) -> None:
        if not self._batch:
            self._export([span])
            return
        self._finished_spans.append(span)
        if self._thread is None and not self._closed:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._export_loop, name="agentstream-spans", daemon=True)
                    self._thread.start()

    def _export_loop(self) -> None:
        while not self._closed:
            self._wake.wait(1.0)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        batch: list[RecordSpan] = []
        queue = self._finished_spans
        while queue:
            batch.append(queue.popleft())
        if batch:
            self._export(batch)

    def _export(self, spans: list[RecordSpan]) -> None:
        try:
            if self._direct is not None:  # the JSON-lines file: no SDK objects at all
                self._direct.write([light_record(s, self.service_name) for s in spans])
            else:
                for span in spans:
                    self.processor.on_end(span.readable(self.resource))
        except Exception:
            log.exception("exporting %d spans failed", len(spans))

    def force_flush(self, timeout_ms: int = 5000) -> bool:
        self._drain()
        return self.provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        with self._lock:
            pending, self._pending_roots = list(self._pending_roots.values()), OrderedDict()
        for span, _ in pending:
            span.end()
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5)
        self._drain()
        self.provider.shutdown()


class JsonLinesSpanExporter(SpanExporter):
    """One compact JSON object per span, appended to a file: read it with ``jq`` when no collector runs.

    Fields: trace_id, span_id, parent_id, name, kind, service, start_ns, end_ns, duration_ms, status,
    attributes. Runs in the BatchSpanProcessor's thread.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.write([span_record(s) for s in spans])

    def write(self, records: Sequence[dict[str, Any]]) -> SpanExportResult:
        """Append span records (``span_record`` / ``light_record`` dicts), one JSON object a line."""
        lines = b"".join(orjson.dumps(r) + b"\n" for r in records)
        try:
            with self._lock:
                self._file.write(lines)
                self._file.flush()
        except (OSError, ValueError) as exc:
            log.warning("trace file %s: %s", self.path, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """A span as a flat dict (the JSON-lines format; tests use it too)."""
    ctx = span.get_span_context()
    if ctx is None:  # the SDK's spans always have one; only a ReadableSpan built by hand may not
        raise ValueError(f"span {span.name!r} has no span context")
    parent = span.parent
    start, end = span.start_time or 0, span.end_time or 0
    return {
        "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name, "kind": span.kind.name,
        "service": span.resource.attributes.get("service.name") if span.resource else None,
        "start_ns": start, "end_ns": end, "duration_ms": (end - start) / 1e6,
        "status": span.status.status_code.name, "status_description": span.status.description,
        "attributes": dict(span.attributes or {}),
    }


def light_record(span: RecordSpan, service: str) -> dict[str, Any]:
    """A ``RecordSpan`` in the JSON-lines format of ``span_record``."""
    ctx, parent = span.context, span.parent
    start, end = span.start_time, span.end_time or span.start_time
    return {
        "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
        "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
        "name": span.name, "kind": span.kind.name, "service": service,
        "start_ns": start, "end_ns": end, "duration_ms": (end - start) / 1e6,
        "status": span.status.status_code.name, "status_description": span.status.description,
        "attributes": span.attributes,
    }


# -- the process's tracing ---------------------------------------------------------------------------
class ProcessTracing:
    """This process's tracing, shared by every runtime and client in it (one exporter, one file; the
    client's root spans and the worker's record spans in one trace). The first configuration wins; a
    worker builds its ``Runtime`` from it once and hands that down, so the hot path never asks here.
    One object for the process (``PROCESS``), explicit rather than module globals."""

    def __init__(self) -> None:
        self._tracing: Tracing | None = None
        self._resolved = False
        self._lock = threading.Lock()

    def install(self, tracing: Tracing | None) -> None:
        """Make ``tracing`` the process's (client root spans, runtimes created from now on); ``None``
        turns it off. Tests install one with an in-memory exporter."""
        with self._lock:
            self._tracing, self._resolved = tracing, True
        header.ROOTS.install(tracing.root_traceparent if tracing is not None else None)

    def for_settings(self, settings: TelemetrySettings, paths: StackPaths | None = None) -> Tracing | None:
        """The installed tracing, else one built from ``settings`` (then installed, and flushed at
        exit), else None."""
        with self._lock:
            if self._resolved:
                return self._tracing
        created = Tracing.from_settings(settings, paths=paths)
        self.install(created)
        if created is not None:
            atexit.register(created.shutdown)
            log.info("tracing on: %s (sample %.3g)", settings.tracing, settings.sample)
        return created

    def from_env(self) -> Tracing | None:
        """The process's tracing, configured from the environment on first use."""
        if self._resolved:
            return self._tracing
        paths = StackPaths.from_env()
        return self.for_settings(TelemetrySettings.load(paths), paths)


#: The process's tracing (see ``ProcessTracing``).
PROCESS = ProcessTracing()


def install(tracing: Tracing | None) -> None:
    """Make ``tracing`` this process's tracing (``ProcessTracing.install``)."""
    PROCESS.install(tracing)


def tracing_for(settings: TelemetrySettings, paths: StackPaths | None = None) -> Tracing | None:
    """The process's tracing, or the one ``settings`` describe on first use (``ProcessTracing.for_settings``)."""
    return PROCESS.for_settings(settings, paths)


def process_tracing() -> Tracing | None:
    """The process's tracing, configured from the environment on first use."""
    return PROCESS.from_env()


__all__ = ["PROCESS", "JsonLinesSpanExporter", "ProcessTracing", "RecordSpan", "Tracing", "format_traceparent",
           "install", "light_record", "parse_traceparent", "process_tracing", "span_record", "tracing_for"]
