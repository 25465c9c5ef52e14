"""Observability: OpenTelemetry tracing (one trace per run) and the trace context carried between events,
Prometheus metrics, health endpoints, consumer-lag and inference-backlog sampling, worker discovery, and
where a record's time goes (``stages``). The ``agentstream top`` dashboard over them is an operator tool
(``agentstream/ops/top.py``).

Everything here is optional at run time: with tracing off and no metrics port, the runtime skips it
on the hot path (a ``None`` check per record).
"""
