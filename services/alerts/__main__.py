"""``python -m agentstream.services.alerts [--from-start] [--log-level info]``: the alerting app as a faust worker."""

from __future__ import annotations

import argparse

from agentstream.services.alerts.app import run_alerts


def main() -> None:
    parser = argparse.ArgumentParser(description="agentstream alerts: thresholds → AlertRaised on agent.alerts")
    parser.add_argument("--from-start", action="store_true", help="a new group reads the results topics from "
                        "their start (default: from their end)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args()
    run_alerts(loglevel=args.log_level, from_start=args.from_start)


if __name__ == "__main__":
    main()
