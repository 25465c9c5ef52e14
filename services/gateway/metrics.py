"""The gateway's Prometheus metrics (``GET /metrics``), on a registry of its own.

What an operator of the door needs to see, and what issue 33 asks to be measured, from inside the process
that does the work (a client's own clock and queueing left out):

- ``agentstream_gateway_token_delivery_seconds``: from a token's record (its Kafka timestamp, stamped by the
  inference service) to its SSE write having completed, per stream;
- ``agentstream_gateway_hub_lag_seconds``: from a token's record to the cell's live fan-out handing it out
  (the part of the delivery that is Kafka's and the producer's, before the gateway's own);
- ``agentstream_gateway_streams_open``, ``agentstream_gateway_requests_in_flight`` (read at scrape time),
  ``agentstream_gateway_stream_events_total``, ``agentstream_gateway_streams_dropped_total`` (slow readers),
  ``agentstream_gateway_runs_submitted_total``; and the process's CPU and memory;
- ``agentstream_gateway_requests_total``: HTTP requests received (the probes and /metrics left out), each
  counted as it arrives, before any limit answers it: the load offered to this replica, whose rate the
  deployment's HorizontalPodAutoscaler follows (docs/deploy.md, "The gateway").

No label carries a tenant or a run: the page is not a way to learn another tenant's activity.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.process_collector import ProcessCollector

_DELIVERY = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class GatewayMetrics:
    def __init__(self, *, streams_open: Callable[[], float], in_flight: Callable[[], float]) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=r)
        self.token_delivery = Histogram("agentstream_gateway_token_delivery_seconds",
                                        "A token's record to its SSE write, per stream", buckets=_DELIVERY, registry=r)
        self.hub_lag = Histogram("agentstream_gateway_hub_lag_seconds",
                                 "A token's record to the live fan-out handing it out", buckets=_DELIVERY, registry=r)
        self.stream_events = Counter("agentstream_gateway_stream_events", "SSE events written", registry=r)
        self.dropped = Counter("agentstream_gateway_streams_dropped", "Streams dropped for reading too slowly",
                               registry=r)
        self.requests = Counter("agentstream_gateway_requests",
                                "HTTP requests received, before any limit (probes and /metrics not counted)", registry=r)
        self.submitted = Counter("agentstream_gateway_runs_submitted", "Tasks submitted (runs and chat completions)",
                                 registry=r)
        Gauge("agentstream_gateway_streams_open", "Open SSE streams", registry=r).set_function(streams_open)
        Gauge("agentstream_gateway_requests_in_flight", "Requests being served (streams not counted)",
              registry=r).set_function(in_flight)


__all__ = ["GatewayMetrics"]
