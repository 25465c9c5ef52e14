"""The Confluent-compatible HTTP registry client, against a minimal in-test registry server."""

from __future__ import annotations

import io
import json
import struct
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fastavro
import pytest

from agentstream.streams.core.errors import DecodeError
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.kafka.codec import Codec
from agentstream.streams.kafka.registry import HttpRegistry, LocalRegistry


class _Registry(BaseHTTPRequestHandler):
    schemas: dict[int, str] = {}
    subjects: dict[str, list[int]] = {}

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # POST /subjects/{subject}/versions
        parts = self.path.strip("/").split("/")
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        canonical = json.dumps(json.loads(body["schema"]), sort_keys=True)
        known = {text: sid for sid, text in self.schemas.items()}
        sid = known.get(canonical, 100 + len(self.schemas))
        self.schemas[sid] = canonical
        self.subjects.setdefault(parts[1], []).append(sid)
        self._send(200, {"id": sid})

    def do_GET(self) -> None:  # GET /schemas/ids/{id}
        sid = int(self.path.rstrip("/").split("/")[-1])
        if sid not in self.schemas:
            self._send(404, {"error_code": 40403, "message": "Schema not found"})
        else:
            self._send(200, {"schema": self.schemas[sid]})


@pytest.fixture
def registry_url() -> Iterator[str]:
    _Registry.schemas, _Registry.subjects = {}, {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Registry)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_registers_by_record_name_and_round_trips(registry_url):
    registry = HttpRegistry(registry_url)
    assert set(_Registry.subjects) == set(LocalRegistry().names())  # RecordNameStrategy subjects
    codec = Codec(registry)
    event = TaskSubmitted.build(run_id="r", step="r:task", service="c", task="t", max_steps=2)
    data = codec.encode(event)
    assert struct.unpack(">bI", data[:5])[1] == registry.id_for(TaskSubmitted.schema_name) >= 100
    assert codec.decode(data) == event
    HttpRegistry(registry_url)  # registering again is idempotent: the same ids
    assert len(_Registry.schemas) == len(LocalRegistry().names())


def test_unknown_ids_are_fetched_and_resolved_or_reported(registry_url):
    codec = Codec(HttpRegistry(registry_url))
    old = json.loads(json.dumps(LocalRegistry().raw_current()[TaskSubmitted.schema_name]))
    old["fields"] = [f for f in old["fields"] if f["name"] != "metadata"]
    old_id = 999
    _Registry.schemas[old_id] = json.dumps(old, sort_keys=True)  # written by some older producer
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, old_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(old), {
        "event_id": "e", "run_id": "r", "step_id": "r:task", "parent_step_id": None, "attempt": 0,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC), "producer": {"service": "old", "instance": "i"},
        "task": "t", "tools": [], "max_steps": 1, "deadline": None, "model": None, "system_prompt": None})
    event = codec.decode(out.getvalue())
    assert isinstance(event, TaskSubmitted) and event.metadata == {}
    with pytest.raises(DecodeError) as info:
        codec.decode(struct.pack(">bI", 0, 4242) + b"\x00")
    assert info.value.kind == "unknown_schema"
