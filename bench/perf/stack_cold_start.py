"""Cold start of the local stack: `agentstream dev up` on an empty state directory, jars cached.

Measures the wall time from the command's start to its exit (Kafka formatted, started and answering
metadata; PostgreSQL initdb'd, started, database created, migrations applied), then `dev down`.
Runs on its own ports and state directory, so it does not touch a stack that is already running.

    .venv/bin/python -m bench.perf.stack_cold_start [--runs 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentstream.devstack.kafka import KafkaLauncher
from agentstream.devstack.process import free_port
from agentstream.streams.config.stack_state import StackPaths


def _cli(env: dict[str, str], *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agentstream.cli", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()

    paths = StackPaths.from_env()
    # Warm the jar cache once (not part of the measured cold start).
    KafkaLauncher(infra_dir=paths.infra_dir, cache_dir=paths.cache_dir, work_dir=Path("/nonexistent"),
                  port=0, controller_port=0).ensure_jars()

    cold, warm, down = [], [], []
    for _ in range(args.runs):
        state = Path(tempfile.mkdtemp(prefix="agentstream-bench-"))
        kafka_port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL")}
        env.update(AGENTSTREAM_STATE_DIR=str(state), AGENTSTREAM_KAFKA_PORT=str(kafka_port),
                   AGENTSTREAM_PG_PORT=str(free_port()))
        try:
            cold.append(_cli(env, "dev", "up"))
            down.append(_cli(env, "dev", "down"))
            warm.append(_cli(env, "dev", "up"))
        finally:
            _cli(env, "dev", "down", "--purge")
            shutil.rmtree(state, ignore_errors=True)
    result = {
        "cold_start_s": round(statistics.median(cold), 2),
        "cold_start_max_s": round(max(cold), 2),
        "restart_s": round(statistics.median(warm), 2),
        "down_s": round(statistics.median(down), 2),
        "runs": args.runs,
    }
    for key, value in result.items():
        print(f"{key:>18}: {value}")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
