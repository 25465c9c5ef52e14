"""Prometheus metrics of one worker process, on a registry of its own.

Cheap on the hot path by construction: every label child a record touches is created once and kept
(``ServiceMetrics``), so handling a record costs a few counter increments and histogram observations
— no label lookups by string formatting, no allocation. Things that are not per record (consumer lag,
the inference backlog, in-flight counts) are sampled periodically or read at scrape time.

Names (all ``agentstream_``-prefixed; ``service`` is planner | inference | retrieval | tools):

- ``handle_seconds{service,event_type}`` histogram: one record, decode to acknowledged outputs
  (its ``_count`` is records handled: steps/s by service);
- ``queue_wait_seconds{service}``: from the record's Kafka timestamp to its handler starting;
- ``events_emitted_total{service,event_type}`` (runs/s: ``RunCompleted`` + ``RunFailed`` from the planner);
- ``dead_letters_total{service,reason}``, ``retries_total{service}``, ``handler_errors_total{service}``,
  ``duplicates_total{service}``, ``in_flight{service}``;
- ``consumer_lag{service,topic,partition}``: end offset minus the group's committed offset;
- ``step_seconds{kind}`` (model — the "thinking time" —, tool, retrieval);
- inference: ``ttft_seconds``, ``decode_tokens_per_second``, ``prompt_tokens_total``,
  ``cached_prompt_tokens_total`` (prefix-cache hits), ``completion_tokens_total``,
  ``generations_in_flight``, ``inference_errors_total{reason}``;
- tools: ``tool_calls_total{tool,outcome}``, ``tool_seconds{tool}``;
- ``inference_backlog_prompt_tokens`` / ``inference_backlog_requests``: the autoscaling signal
  (``streams/telemetry/backlog.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.process_collector import ProcessCollector

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_STEP = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_TTFT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_TOKS = (1, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560)


class Metrics:
    """Every metric family of a worker, registered on ``self.registry`` (served at ``/metrics``)."""

    def __init__(self, registry: CollectorRegistry | None = None, *, process: bool = True) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        if process:
            ProcessCollector(registry=r)
        p = "agentstream_"
        self.info = Info(p + "worker", "This worker: its services and instance.", registry=r)
        #: 1 while /readyz answers 200; the worker binds it to its readiness (``set_function``).
        self.ready = Gauge(p + "worker_ready", "1 when the worker is ready (/readyz answers 200), else 0: loading "
                           "its model, joining its groups, waiting out an outage, stopping.", registry=r)
        self.handle_seconds = Histogram(p + "handle_seconds", "Handling one record, decode to acknowledged outputs.",
                                        ["service", "event_type"], buckets=_FAST, registry=r)
        self.queue_wait = Histogram(p + "queue_wait_seconds", "From a record's Kafka timestamp to its handler starting.",
                                    ["service"], buckets=_FAST, registry=r)
        self.emitted = Counter(p + "events_emitted", "Events published by handlers.", ["service", "event_type"],
                               registry=r)
        self.dead_letters = Counter(p + "dead_letters", "Records sent to the dead-letter topic.", ["service", "reason"],
                                    registry=r)
        self.retries = Counter(p + "retries", "Handler attempts retried after a retriable error.", ["service"],
                               registry=r)
        self.handler_errors = Counter(p + "handler_errors", "Exceptions raised by handlers (retried or not).",
                                      ["service"], registry=r)
        self.duplicates = Counter(p + "duplicates", "Redelivered records dropped as already done.", ["service"],
                                  registry=r)
        self.in_flight = Gauge(p + "in_flight", "Records fetched and not yet done.", ["service"], registry=r)
        self.lag = Gauge(p + "consumer_lag", "End offset minus the group's committed offset (sampled).",
                         ["service", "topic", "partition"], registry=r)
        self.step_seconds = Histogram(p + "step_seconds", "A step's duration in its service, by kind "
                                      "(model: the thinking time).", ["kind"], buckets=_STEP, registry=r)
        self.ttft = Histogram(p + "ttft_seconds", "Time to the first generated token.", buckets=_TTFT, registry=r)
        self.tokens_per_s = Histogram(p + "decode_tokens_per_second", "Completion tokens per second after the first.",
                                      buckets=_TOKS, registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens of finished generations.", registry=r)
        self.cached_prompt_tokens = Counter(p + "cached_prompt_tokens", "Prompt tokens served from the prefix cache.",
                                            registry=r)
        self.completion_tokens = Counter(p + "completion_tokens", "Tokens generated.", registry=r)
        self.generations = Gauge(p + "generations_in_flight", "Generations running in the engine.", registry=r)
        self.inference_errors = Counter(p + "inference_errors", "Model steps that ended in an error.", ["reason"],
                                        registry=r)
        self.tool_calls = Counter(p + "tool_calls", "Tool calls answered, by outcome (ok or the error kind).",
                                  ["tool", "outcome"], registry=r)
        self.tool_seconds = Histogram(p + "tool_seconds", "A tool call, from request to answer.", ["tool"],
                                      buckets=_STEP, registry=r)
        self.backlog_tokens = Gauge(p + "inference_backlog_prompt_tokens",
                                    "Estimated prompt tokens of InferenceRequested records not yet committed by the "
                                    "inference group (this planner's partitions; sum over planners).", registry=r)
        self.backlog_requests = Gauge(p + "inference_backlog_requests",
                                      "InferenceRequested records not yet committed by the inference group.", registry=r)
        self._services: dict[str, ServiceMetrics] = {}

    def service(self, name: str, in_flight: Callable[[], float] | None = None) -> ServiceMetrics:
        """The precreated children of one service (``in_flight`` is read at scrape time)."""
        sm = self._services.get(name)
        if sm is None:
            sm = self._services[name] = ServiceMetrics(self, name)
        if in_flight is not None:
            self.in_flight.labels(name).set_function(in_flight)
        return sm


class ServiceMetrics:
    """The label children one service's records touch, created on first use and kept."""

    __slots__ = ("_dead", "_emitted", "_handled", "_m", "duplicates", "errors", "name", "queue_wait", "retries")

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._m = metrics
        self.name = name
        self.queue_wait = metrics.queue_wait.labels(name)
        self.retries = metrics.retries.labels(name)
        self.errors = metrics.handler_errors.labels(name)
        self.duplicates = metrics.duplicates.labels(name)
        self._handled: dict[str, Histogram] = {}
        self._emitted: dict[type, Counter] = {}
        self._dead: dict[str, Counter] = {}

    def handled(self, event_type: str) -> Histogram:
        child = self._handled.get(event_type)
        if child is None:
            child = self._handled[event_type] = self._m.handle_seconds.labels(self.name, event_type)
        return child

    def emitted(self, event_class: type) -> Counter:
        child = self._emitted.get(event_class)
        if child is None:
            child = self._emitted[event_class] = self._m.emitted.labels(self.name, event_class.__name__)
        return child

    def dead_letter(self, reason: str) -> Counter:
        child = self._dead.get(reason)
        if child is None:
            child = self._dead[reason] = self._m.dead_letters.labels(self.name, reason)
        return child


__all__ = ["Metrics", "ServiceMetrics"]
