"""The alerting app: a faust-streaming application with a windowed Table.

It consumes ``agent.tool.results`` and ``agent.inference.results`` (Avro, decoded with the project's
codec), keeps per-subject counts in a faust Table over tumbling windows (``AGENTSTREAM_ALERT_WINDOW_S``,
by the records' Kafka timestamps), applies ``services/alerts/rules.py``, and publishes ``AlertRaised`` on
``agent.alerts`` (key: the subject; the traceparent of the step that crossed the threshold, so the alert
links to the run's trace) and a log line. A faust timer on the leader checks the service groups'
consumer lag (committed versus end offsets) every ``AGENTSTREAM_ALERT_LAG_INTERVAL_S``.

This is the windowed aggregation faust-streaming is kept for (docs/architecture.md): the table's
changelog restores the windows after a restart. The table is keyed by subject (a tool, a model) while
the topics are keyed by run, and it is not repartitioned (a ``group_by`` would send every result through
Kafka a second time): one instance sees every subject whole; with several, each aggregates the
partitions it owns (a failure rate is then measured on a share of the calls, still a rate), and two
instances may raise the same alert — it has the same deterministic id, so consumers can drop the copy.

Run it with ``python -m agentstream.services.alerts`` (or the CLI command the lead wires to ``run_alerts``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import faust
from aiokafka import AIOKafkaProducer, TopicPartition

from agentstream.services.alerts import rules
from agentstream.streams.config.alerts import AlertSettings
from agentstream.streams.config.kafka_defaults import disable_auto_topic_creation
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import AlertRaised, InferenceCompleted, ToolCallCompleted
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.telemetry.lag import GroupOffsets

log = logging.getLogger(__name__)

TYPE_HEADER = "agentstream-type"
TRACE_HEADER = "traceparent"
SERVICE_GROUPS = ("planner", "inference", "retrieval", "tools")


class AlertsApp:
    """The faust app and its state. ``start()``/``stop()`` run it on the current event loop (tests);
    ``run_alerts`` runs it as a faust worker process."""

    def __init__(self, settings: Settings, thresholds: AlertSettings | None = None, *, from_start: bool = False,
                 datadir: Path | None = None) -> None:
        self.settings = settings
        self.thresholds = th = thresholds or AlertSettings.load()
        self.topics = topics = Topics.of(settings)
        self.codec = codec_for(settings)
        self.app_id = f"{settings.topic_prefix}agentstream-alerts"
        datadir = datadir or settings.paths.state_dir / "faust" / self.app_id
        datadir.parent.mkdir(parents=True, exist_ok=True)
        disable_auto_topic_creation()  # faust builds its own aiokafka clients, not from kafka_options
        self.app = app = faust.App(
            self.app_id,
            broker=[f"kafka://{host}" for host in settings.kafka_bootstrap.split(",")],
            broker_credentials=settings.kafka_auth.faust_credentials(),
            store="memory://", web_enabled=False,
            topic_partitions=settings.partitions, topic_replication_factor=topics.replication_factor,
            consumer_auto_offset_reset="earliest" if from_start else "latest",
            broker_commit_interval=1.0, table_cleanup_interval=max(5.0, th.window_s),
            datadir=str(datadir),
        )
        raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                               "value_serializer": "raw"}
        self.source = app.topic(topics.tool_results, topics.inference_results, **raw)
        self.out = app.topic(topics.alerts, **raw)
        #: Per subject ("tool:NAME", "model:NAME") and window: calls, failures, slow calls, what alerted.
        self.stats = app.Table("step-stats", default=dict, partitions=settings.partitions).tumbling(
            th.window_s, expires=timedelta(seconds=3 * th.window_s)).relative_to_stream()
        #: Alerts raised by this process, newest last (tests and the CLI read it).
        self.raised: deque[AlertRaised] = deque(maxlen=1000)
        self._lagging: dict[tuple[str, str], float] = {}
        self._offsets: GroupOffsets | None = None

        async def thresholds_agent(stream: Any) -> None:
            async for event in stream.events():
                await self._on_record(event.message, event.value)

        app.agent(self.source, name="thresholds")(thresholds_agent)

        async def lag_timer() -> None:
            await self.check_lag()

        app.timer(interval=th.lag_interval_s, on_leader=True, name="consumer-lag")(lag_timer)

        async def before_shutdown(_sender: Any, /, *_args: Any, signal: Any, **_kwargs: Any) -> None:
            # mode calls a receiver as receiver(sender, *args, signal=the_signal, **kwargs)
            await self._close_offsets()

        app.on_before_shutdown.connect(before_shutdown)

    # -- step results ----------------------------------------------------------------------------
    async def _on_record(self, message: Any, value: bytes | None) -> None:
        try:
            event = await self.codec.decode_async(value)
        except DecodeError:
            return
        if time.time() - message.timestamp > self.thresholds.max_age_s:
            return  # history read after a restart or a long pause: too late to alert on
        window = rules.window_of(message.timestamp, self.thresholds.window_s)
        alerts: list[rules.Alert] = []
        if isinstance(event, ToolCallCompleted) and not event.replayed:
            key = f"tool:{event.tool}"
            stats = dict(self.stats[key].current())
            stats["calls"] = stats.get("calls", 0) + 1
            stats["failures"] = stats.get("failures", 0) + (0 if event.ok else 1)
            slow = rules.slow_tool(event, self.thresholds)
            if slow is not None:
                stats["slow"] = stats.get("slow", 0) + 1
                if not stats.get("slow_alerted"):
                    stats["slow_alerted"] = True
                    alerts.append(replace(slow, window=window))
            rate = rules.tool_failure_rate(event.tool, stats["calls"], stats["failures"], self.thresholds)
            if rate is not None and not stats.get("rate_alerted"):
                stats["rate_alerted"] = True
                alerts.append(replace(rate, window=window, run_id=event.run_id, step_id=event.step_id))
            self.stats[key] = stats
        elif isinstance(event, InferenceCompleted):
            slow = rules.slow_model_step(event, self.thresholds)
            if slow is not None:
                key = f"model:{slow.subject}"
                stats = dict(self.stats[key].current())
                stats["slow"] = stats.get("slow", 0) + 1
                if not stats.get("slow_alerted"):
                    stats["slow_alerted"] = True
                    alerts.append(replace(slow, window=window))
                self.stats[key] = stats
        for alert in alerts:
            await self.raise_alert(alert, _header(message.headers, TRACE_HEADER))

    async def raise_alert(self, alert: rules.Alert, traceparent: bytes | None = None) -> AlertRaised:
        """Publish ``alert`` on agent.alerts and log it."""
        event = alert.event()
        log.warning("ALERT %s [%s] %s: %s", alert.kind, alert.severity, alert.subject, alert.message)
        headers = [(TYPE_HEADER, b"AlertRaised")]
        if traceparent:
            headers.append((TRACE_HEADER, traceparent))
        await self.out.send(key=alert.subject.encode(), value=self.codec.encode(event), headers=headers)
        self.raised.append(event)
        return event

    # -- consumer lag ----------------------------------------------------------------------------
    def _group_topics(self) -> dict[str, list[str]]:
        t = self.topics
        return {t.group("planner"): t.planner_inputs, t.group("inference"): [t.inference_requests],
                t.group("retrieval"): [t.retrieval_requests], t.group("tools"): [t.tool_requests]}

    async def check_lag(self) -> list[AlertRaised]:
        """Alert once per episode when a group is past the threshold on a topic; the episode ends when
        its lag is back under half the threshold. Groups that never committed (a service that is not
        deployed) are skipped."""
        if self._offsets is None:
            self._offsets = GroupOffsets(self.settings.kafka_bootstrap, f"{self.app_id}-lag",
                                         auth=self.settings.kafka_auth)
            await self._offsets.start()
        raised = []
        n = self.topics.partitions
        for group, topics in self._group_topics().items():
            tps = [TopicPartition(topic, p) for topic in topics for p in range(n)]
            assert self._offsets.admin is not None
            if not await self._offsets.admin.list_consumer_group_offsets(group):
                continue
            lag_by_topic: dict[str, int] = {}
            for tp, (committed, end) in (await self._offsets.positions(group, tps)).items():
                lag_by_topic[tp.topic] = lag_by_topic.get(tp.topic, 0) + max(0, end - committed)
            for topic, lag in lag_by_topic.items():
                key = (group, topic)
                alert = rules.consumer_lag(group, topic, lag, self.thresholds)
                if alert is not None and key not in self._lagging:
                    self._lagging[key] = started = time.time()
                    raised.append(await self.raise_alert(replace(alert, window=(started, started))))
                elif alert is None and lag < self.thresholds.lag_records / 2:
                    self._lagging.pop(key, None)
        return raised

    # -- running ---------------------------------------------------------------------------------
    async def ensure_topics(self) -> None:
        """The catalogue's topics (agent.alerts among them): the app may start before any worker."""
        await ensure_topics(self.settings.kafka_bootstrap, self.topics.specs(), auth=self.settings.kafka_auth)

    async def start(self) -> None:
        await self.ensure_topics()
        if self.codec.schemas is not None:  # AlertRaised's schema, for readers of another version
            producer = AIOKafkaProducer(**self.settings.kafka_options(), acks="all")
            await producer.start()
            try:
                await self.codec.schemas.publish(producer)
            finally:
                await producer.stop()
        await self.app.start()

    async def stop(self) -> None:
        await self.app.stop()
        await self._close_offsets()

    async def _close_offsets(self) -> None:
        offsets, self._offsets = self._offsets, None
        if offsets is not None:
            await offsets.stop()
        await self.codec.close()  # the schemas topic's consumer, if a lookup started one


def _header(headers: Any, name: str) -> bytes | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, dict) else headers
    for key, value in items:
        if key == name:
            return value if isinstance(value, bytes) else str(value).encode()
    return None


def run_alerts(settings: Settings | None = None, thresholds: AlertSettings | None = None, *,
               loglevel: str = "info", from_start: bool = False) -> None:
    """Run the alerting app as a faust worker until SIGINT/SIGTERM (the ``agentstream alerts`` command)."""
    alerts = AlertsApp(settings or Settings.load(), thresholds, from_start=from_start)
    asyncio.run(alerts.ensure_topics())
    worker = faust.Worker(alerts.app, loglevel=loglevel)
    worker.execute_from_commandline()


__all__ = ["AlertsApp", "run_alerts"]
