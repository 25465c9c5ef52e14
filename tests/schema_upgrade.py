"""A "newer release" of the event schemas, for upgrade tests: the package's schemas with one optional
field added to some events, as a release that adds a field would ship them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from agentstream.streams.core import resources

#: The field the newer release adds (optional, with a default: a compatible change both ways).
PROBE = {"name": "upgrade_probe", "type": ["null", "string"], "default": None}
#: Events that flow between the client and the services, and between services, on every run.
CHANGED = ("TaskSubmitted", "InferenceRequested", "InferenceCompleted", "ToolCallRequested", "ToolCallCompleted",
           "RunCompleted")


def newer_schemas(directory: Path, records: tuple[str, ...] = CHANGED) -> Path:
    """Copy the package's schemas (with history/) to ``directory`` and add ``PROBE`` to ``records``."""
    shutil.copytree(resources.schemas_dir(), directory)
    for record in records:
        path = directory / f"{record}.avsc"
        raw = json.loads(path.read_text())
        raw["fields"].append(dict(PROBE))
        path.write_text(json.dumps(raw, indent=2) + "\n")
    return directory
