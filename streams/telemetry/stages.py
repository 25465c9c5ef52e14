"""Where a record's time goes, stage by stage — the data behind ``bench/perf/pipeline.py --breakdown``.

Off unless ``AGENTSTREAM_STAGES_DIR`` names a directory. Then every process that consumes records
keeps, per stage (``"planner.handle"``, ``"inference.deliver"``, …), the wall-clock time each one
ended and how long it took, and writes them there as ``stages-{pid}.json`` when it exits, with its
CPU time. The benchmark keeps the samples of its measured window and adds them up per run.

It is a benchmark's instrument, not telemetry (Prometheus histograms are, ``metrics.py``): samples
stay in memory (capped) and nothing is exported while the process runs. The environment is read once
per process (``PROCESS``); the runtime hands the clock down (``Runtime.stages``) and times a record's
stages with a middleware it installs only when there is a clock
(``streams/runtime/middleware/stages.py``), so when off the consumer loop does not see it at all.
"""

from __future__ import annotations

import atexit
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path

ENV = "AGENTSTREAM_STAGES_DIR"
#: Samples kept per stage (a benchmark's measured window is far smaller).
CAP = 500_000


class StageClock:
    """Durations by stage, each with the time it ended (to keep a window's)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.samples: dict[str, list[tuple[float, float]]] = {}

    def add(self, stage: str, seconds: float, *, at: float | None = None) -> None:
        samples = self.samples.setdefault(stage, [])
        if len(samples) < CAP:
            samples.append((time.time() if at is None else at, seconds * 1000))

    def since(self, stage: str, started: float) -> None:
        """Record ``stage`` as having run from ``started`` (``time.perf_counter()``) until now."""
        self.add(stage, time.perf_counter() - started)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> StageClock | None:
        """The clock ``AGENTSTREAM_STAGES_DIR`` asks for (its directory created), or None when unset."""
        directory = environ.get(ENV)
        if not directory:
            return None
        Path(directory).mkdir(parents=True, exist_ok=True)
        return cls(Path(directory))

    def write(self) -> Path:
        times = os.times()
        path = self.directory / f"stages-{os.getpid()}.json"
        path.write_text(json.dumps({"pid": os.getpid(), "cpu_s": times.user + times.system,
                                    "samples": self.samples}))
        return path


class ProcessStages:
    """This process's stage clock, built the first time it is asked for: from ``AGENTSTREAM_STAGES_DIR``
    (read that once), written to that directory at exit. One object for the process, because its
    samples go to one file per pid: a client that builds several runtimes, and the worker whose
    runtime its services share, all record into the same clock. Pass the clock down from here
    (``Runtime.stages``); do not read the environment on the hot path."""

    def __init__(self) -> None:
        self._clock: StageClock | None = None
        self._read = False

    def clock(self) -> StageClock | None:
        """The clock, or None when ``AGENTSTREAM_STAGES_DIR`` was not set when first asked."""
        if not self._read:
            self._read = True
            self._clock = StageClock.from_env()
            if self._clock is not None:
                atexit.register(self._clock.write)
        return self._clock


#: The process's stage clock (see ``ProcessStages``).
PROCESS = ProcessStages()


def clock() -> StageClock | None:
    """This process's stage clock, or None when ``AGENTSTREAM_STAGES_DIR`` is not set (``PROCESS``)."""
    return PROCESS.clock()


def window(samples: dict[str, list[tuple[float, float]]], start: float, end: float) -> dict[str, list[float]]:
    """The durations (ms) by stage of the samples that ended within ``[start, end]`` (epoch seconds)."""
    return {stage: [ms for at, ms in values if start <= at <= end] for stage, values in samples.items()}


def read(directory: Path) -> dict[int, dict[str, list[tuple[float, float]]]]:
    """The samples each process wrote to ``directory`` when it exited, by pid."""
    out: dict[int, dict[str, list[tuple[float, float]]]] = {}
    for path in sorted(directory.glob("stages-*.json")):
        data = json.loads(path.read_text())
        out[data["pid"]] = {stage: [(at, ms) for at, ms in values] for stage, values in data["samples"].items()}
    return out


__all__ = ["CAP", "ENV", "PROCESS", "ProcessStages", "StageClock", "clock", "read", "window"]
