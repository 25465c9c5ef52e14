"""The alert rules, as pure functions of events, window counts and settings (the faust app in
``services/alerts/app.py`` feeds them; unit tests call them directly).

- ``slow_tool``: a tool call took longer than its threshold (``AGENTSTREAM_ALERT_TOOL_SLOW_S``, with
  per-tool overrides); a call answered from the idempotency record (``replayed``) never counts;
- ``slow_model_step``: a model step's "thinking time" (``InferenceCompleted.duration_ms``: from the
  request reaching the inference service to its answer) above ``AGENTSTREAM_ALERT_MODEL_STEP_S``;
- ``tool_failure_rate``: within one tumbling window, failed calls / calls of a tool at or above the rate,
  once there were at least ``min_calls`` calls;
- ``consumer_lag``: a consumer group is more than ``lag_records`` behind on a topic.

The slow-step and failure-rate alerts fire at most once per kind, subject and window; the window and
its counts are in the alert, so one alert says "and 14 more like it in this minute".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from agentstream.streams.config.alerts import AlertSettings
from agentstream.streams.core.events import AlertRaised, InferenceCompleted, ToolCallCompleted

SERVICE = "alerts"


@dataclass(frozen=True, kw_only=True)
class Alert:
    kind: str
    subject: str
    value: float
    threshold: float
    unit: str
    message: str
    severity: str = "warning"
    count: int = 0
    #: The step that crossed the threshold, when one did.
    run_id: str = ""
    step_id: str | None = None
    #: The tumbling window (epoch seconds) for windowed alerts; the lag episode's start for lag alerts.
    window: tuple[float, float] | None = None

    @property
    def key(self) -> str:
        """One alert per kind, subject and window: the id its AlertRaised is derived from."""
        start = f"{self.window[0]:.0f}" if self.window is not None else (self.step_id or "")
        return f"alert:{self.kind}:{self.subject}:{start}"

    def event(self) -> AlertRaised:
        window_start = window_end = None
        if self.window is not None:
            window_start = datetime.fromtimestamp(self.window[0], UTC)
            window_end = datetime.fromtimestamp(self.window[1], UTC)
        return AlertRaised.build(run_id=self.run_id, step=self.key, service=SERVICE, parent_step_id=self.step_id,
                                 kind=self.kind, severity=self.severity, subject=self.subject, value=self.value,
                                 threshold=self.threshold, unit=self.unit, count=self.count,
                                 window_start=window_start, window_end=window_end, message=self.message)


def slow_tool(result: ToolCallCompleted, settings: AlertSettings) -> Alert | None:
    if result.replayed:
        return None
    seconds = result.duration_ms / 1000
    threshold = settings.tool_threshold_s(result.tool)
    if seconds <= threshold:
        return None
    return Alert(kind="slow_tool", subject=result.tool, value=seconds, threshold=threshold, unit="s",
                 run_id=result.run_id, step_id=result.step_id, count=1,
                 message=f"tool {result.tool} took {seconds:.2f} s (threshold {threshold:g} s) in {result.step_id}")


def slow_model_step(result: InferenceCompleted, settings: AlertSettings) -> Alert | None:
    seconds = result.duration_ms / 1000
    if seconds <= settings.model_step_s:
        return None
    model = result.model or result.backend or "model"
    return Alert(kind="slow_model_step", subject=model, value=seconds, threshold=settings.model_step_s, unit="s",
                 run_id=result.run_id, step_id=result.step_id, count=1,
                 message=f"model step {result.step_id} thought for {seconds:.2f} s "
                         f"(threshold {settings.model_step_s:g} s; {result.completion_tokens} tokens, "
                         f"TTFT {result.ttft_ms:.0f} ms)")


def tool_failure_rate(tool: str, calls: int, failures: int, settings: AlertSettings) -> Alert | None:
    if calls < settings.tool_min_calls or calls == 0:
        return None
    rate = failures / calls
    if rate < settings.tool_failure_rate:
        return None
    return Alert(kind="tool_failure_rate", subject=tool, value=rate, threshold=settings.tool_failure_rate,
                 unit="ratio", count=calls, severity="critical" if rate >= 0.9 else "warning",
                 message=f"tool {tool} failed {failures} of {calls} calls ({rate:.0%}) in the last "
                         f"{settings.window_s:g} s window (threshold {settings.tool_failure_rate:.0%})")


def consumer_lag(group: str, topic: str, lag: int, settings: AlertSettings) -> Alert | None:
    if lag <= settings.lag_records:
        return None
    return Alert(kind="consumer_lag", subject=f"{group}/{topic}", value=float(lag),
                 threshold=float(settings.lag_records), unit="records", count=lag,
                 severity="critical" if lag > 10 * settings.lag_records else "warning",
                 message=f"consumer group {group} is {lag} records behind on {topic} "
                         f"(threshold {settings.lag_records})")


def window_of(timestamp: float, size: float) -> tuple[float, float]:
    """The tumbling window ``[start, end)`` holding ``timestamp`` (as faust's tumbling windows cut them)."""
    start = timestamp - timestamp % size
    return start, start + size


__all__ = ["Alert", "consumer_lag", "slow_model_step", "slow_tool", "tool_failure_rate", "window_of"]
