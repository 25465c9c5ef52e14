"""The wheel, as a user gets it: built from this repository, installed with pip (not ``-e``) into a fresh
virtual environment with the base dependencies only (what a client needs), and used from a directory
outside the source tree. Catches what an editable install hides: data files (schemas, migrations) left
out of the wheel, modules that import a worker's dependencies from a client's path, stray top-level
packages.

Needs pip to reach PyPI (or its cache) for the base dependencies, as CI has; the build itself runs
``python -m build`` (isolated, like any user's build).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]

#: Runs inside the fresh environment: every event type encoded and decoded through the public codec,
#: from an Avro datum that plain fastavro writes from the shipped schema (as any other client would).
CHECK = textwrap.dedent('''
    import io, json, struct, sys, uuid
    from datetime import UTC, datetime
    from importlib.resources import files

    import fastavro
    import agentstream
    from agentstream import EVENT_TYPES, Codec
    from agentstream.streams.kafka.registry import LocalRegistry
    from agentstream.streams.store.migrations import discover

    def sample(schema, named):
        if isinstance(schema, list):
            return sample(next(s for s in schema if s != "null"), named)
        if isinstance(schema, str):
            if schema in named:
                return sample(named[schema], named)
            return {"string": "x", "int": 1, "long": 1, "float": 1.5, "double": 1.5, "boolean": True,
                    "bytes": b"x", "null": None}[schema]
        kind = schema["type"]
        if schema.get("logicalType", "").startswith("timestamp"):
            return datetime(2026, 1, 1, tzinfo=UTC)
        if kind == "record":
            named[schema["name"]] = named[schema.get("namespace", "") + "." + schema["name"]] = schema
            return {f["name"]: (str(uuid.uuid4()) if f["name"] == "event_id" else sample(f["type"], named))
                    for f in schema["fields"]}
        if kind == "enum":
            return schema["symbols"][0]
        if kind == "array":
            return [sample(schema["items"], named)]
        if kind == "map":
            return {"k": sample(schema["values"], named)}
        return sample(kind, named)

    registry = LocalRegistry()
    codec = Codec(registry)
    schemas = files("agentstream") / "schemas"
    for name, cls in sorted(EVENT_TYPES.items()):
        raw = json.loads((schemas / f"{name.rsplit('.', 1)[-1]}.avsc").read_text())
        out = io.BytesIO()
        out.write(struct.pack(">bI", 0, registry.id_for(name)))
        fastavro.schemaless_writer(out, fastavro.parse_schema(raw), sample(raw, {}))
        event = codec.decode(out.getvalue())
        assert type(event) is cls, (name, type(event))
        assert codec.decode(codec.encode(event)) == event, name
    assert len(discover()) >= 9
    import agentstream.streams.client.agent_client, agentstream.streams.replay.timeline  # the client's parts, base deps only
    try:
        agentstream.Pipeline
    except agentstream.MissingExtra as exc:
        missing = str(exc)
    else:
        missing = None
    print(json.dumps({"events": len(EVENT_TYPES), "all": len(agentstream.__all__), "missing": missing}))
''')


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed (base dependencies only)."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(REPO)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist.glob("agentstream-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    return venv


def run(venv: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "COLUMNS": "200"})


def test_wheel_has_one_top_level_package(installed: Path) -> None:
    (site,) = (installed / "lib").glob("python3*/site-packages")
    record = next(site.glob("agentstream-*.dist-info")) / "RECORD"
    tops = {line.split("/")[0].split(",")[0] for line in record.read_text().splitlines()}
    tops = {t for t in tops if not t.endswith(".dist-info") and t != "__pycache__" and not t.startswith("..")}
    assert tops == {"agentstream"}, tops
    assert not (site / "streams").exists() and not (site / "services").exists()
    assert (site / "agentstream" / "py.typed").exists()
    console = site / "agentstream" / "services" / "gateway" / "console"  # the web console: package data
    assert {p.name for p in console.iterdir()} >= {"index.html", "console.js", "console.css"}


def test_the_installed_wheel_encodes_every_event_and_names_missing_extras(installed: Path,
                                                                         tmp_path: Path) -> None:
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    result = run(installed, "python", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["events"] >= 17 and report["all"] > 30
    # The base install has no worker dependencies: the test pipeline says which extra brings them.
    assert report["missing"] and "pip install 'agentstream[worker]'" in report["missing"]
    probe = run(installed, "python", "-c", "import streams", cwd=tmp_path)
    assert probe.returncode != 0 and "No module named 'streams'" in probe.stderr


def test_the_installed_cli_runs_and_explains_a_missing_extra(installed: Path, tmp_path: Path) -> None:
    helped = run(installed, "agentstream", "--help", cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    for command in ("submit", "status", "cancel", "replay", "worker", "dev", "dlq"):
        assert command in helped.stdout
    worker = run(installed, "agentstream", "worker", "planner", cwd=tmp_path)
    assert worker.returncode == 2, worker.stdout + worker.stderr
    assert "agentstream[worker]" in worker.stderr, worker.stderr
    assert "Traceback" not in worker.stderr
