"""CPU time of processes from Linux ``/proc``, for the benchmarks that report CPU per step or per record."""

from __future__ import annotations

import os
from pathlib import Path


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[int], *, children: bool = False) -> float:
    """User + system CPU time of these processes so far. ``children``: with every live child's, and the
    reaped children's (PostgreSQL's backends, which come and go). A process that is gone counts 0."""
    ticks = 0
    targets = set(pids)
    for pid in pids:
        try:
            fields = _stat_fields(pid)
            ticks += int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children else 0)
        except (OSError, IndexError, ValueError):
            pass
    if children:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = _stat_fields(int(entry.name))
                if int(fields[1]) in targets:
                    ticks += sum(int(f) for f in fields[11:15])
            except (OSError, IndexError, ValueError):
                pass
    return ticks / os.sysconf("SC_CLK_TCK")
