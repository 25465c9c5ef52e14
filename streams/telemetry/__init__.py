"""Observability: OpenTelemetry tracing (one trace per run), Prometheus metrics, health endpoints,
consumer-lag and inference-backlog sampling, worker discovery and the ``agentstream top`` dashboard.

Everything here is optional at run time: with tracing off and no metrics port, the runtime skips it
on the hot path (a ``None`` check per record).
"""
