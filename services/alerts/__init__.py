"""Alerting: thresholds on step durations, tool failure rates and consumer lag → AlertRaised on agent.alerts."""
