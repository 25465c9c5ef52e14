"""The alert rules (services/alerts/rules.py): thresholds, windows, and the events they raise."""

from __future__ import annotations

from dataclasses import replace

from agentstream.services.alerts import rules
from agentstream.streams.config.alerts import AlertSettings
from agentstream.streams.core.events import AlertRaised, InferenceCompleted, ToolCallCompleted
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import LocalRegistry

SETTINGS = AlertSettings(tool_slow_s=5.0, tool_slow_overrides={"sleep": 0.2}, model_step_s=10.0,
                         tool_failure_rate=0.5, tool_min_calls=4, window_s=60.0, lag_records=100)


def _tool(tool: str, ms: float, ok: bool = True, replayed: bool = False) -> ToolCallCompleted:
    return ToolCallCompleted.build(run_id="run-1", step="run-1:1:tool", service="tools", tool=tool, ok=ok,
                                   duration_ms=ms, replayed=replayed)


def test_a_tool_slower_than_its_threshold_alerts():
    assert rules.slow_tool(_tool("sleep", 150), SETTINGS) is None
    alert = rules.slow_tool(_tool("sleep", 500), SETTINGS)
    assert alert is not None and (alert.kind, alert.subject, alert.threshold) == ("slow_tool", "sleep", 0.2)
    assert alert.value == 0.5 and alert.run_id == "run-1" and alert.step_id == "run-1:1:tool"
    assert rules.slow_tool(_tool("calculator", 500), SETTINGS) is None  # the default, 5 s
    assert rules.slow_tool(_tool("sleep", 5000, replayed=True), SETTINGS) is None  # nothing ran


def test_thinking_time():
    result = InferenceCompleted.build(run_id="r", step="r:0:model", service="inference", text="", finish_reason="stop",
                                      duration_ms=12_500, model="smollm2", completion_tokens=40, ttft_ms=300)
    alert = rules.slow_model_step(result, SETTINGS)
    assert alert is not None and alert.subject == "smollm2" and alert.value == 12.5
    assert rules.slow_model_step(replace(result, duration_ms=9_000), SETTINGS) is None


def test_failure_rate_needs_enough_calls():
    assert rules.tool_failure_rate("http_get", 3, 3, SETTINGS) is None
    assert rules.tool_failure_rate("http_get", 4, 1, SETTINGS) is None
    alert = rules.tool_failure_rate("http_get", 4, 2, SETTINGS)
    assert alert is not None and alert.value == 0.5 and alert.count == 4 and alert.severity == "warning"
    assert rules.tool_failure_rate("http_get", 10, 10, SETTINGS).severity == "critical"


def test_lag():
    assert rules.consumer_lag("g", "t", 100, SETTINGS) is None
    alert = rules.consumer_lag("g", "t", 101, SETTINGS)
    assert alert is not None and alert.subject == "g/t" and alert.unit == "records"


def test_one_alert_id_per_kind_subject_and_window():
    assert rules.window_of(125.0, 60.0) == (120.0, 180.0)
    alert = rules.slow_tool(_tool("sleep", 500), SETTINGS)
    a = replace(alert, window=rules.window_of(130.0, 60.0))
    b = replace(alert, window=rules.window_of(170.0, 60.0), run_id="run-2")
    assert a.event().event_id == b.event().event_id  # same window: the same alert
    c = replace(alert, window=rules.window_of(190.0, 60.0))
    assert c.event().event_id != a.event().event_id


def test_alert_raised_round_trips_through_the_codec():
    event = replace(rules.consumer_lag("g", "t", 500, SETTINGS), window=(1.0, 1.0)).event()
    assert event.run_id == "" and event.problem() is None
    codec = Codec(LocalRegistry())
    decoded = codec.decode(codec.encode(event))
    assert isinstance(decoded, AlertRaised) and decoded == event
