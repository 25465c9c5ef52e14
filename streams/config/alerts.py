"""The alerting app's thresholds (services/alerts): ``AlertSettings``."""

from __future__ import annotations

from dataclasses import dataclass, field

from agentstream.streams.config import env


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
        default, overrides = env.threshold_spec("AGENTSTREAM_ALERT_TOOL_SLOW_S", 10.0)
        return cls(
            model_step_s=env.positive_float("AGENTSTREAM_ALERT_MODEL_STEP_S", 30.0),
            tool_slow_s=default, tool_slow_overrides=overrides,
            tool_failure_rate=env.fraction("AGENTSTREAM_ALERT_TOOL_FAILURE_RATE", 0.5),
            tool_min_calls=env.positive_int("AGENTSTREAM_ALERT_TOOL_MIN_CALLS", 5),
            window_s=env.positive_float("AGENTSTREAM_ALERT_WINDOW_S", 60.0),
            lag_records=env.positive_int("AGENTSTREAM_ALERT_LAG", 1000),
            lag_interval_s=env.positive_float("AGENTSTREAM_ALERT_LAG_INTERVAL_S", 15.0),
            max_age_s=env.positive_float("AGENTSTREAM_ALERT_MAX_AGE_S", 300.0),
        )
