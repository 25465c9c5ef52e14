"""Replay end to end on the real broker and database: timeline + Kafka cross-check, recorded rerun,
fork, diff, and the HTML timeline rendered by headless Chromium.

One original 5-step run (model → tool → model → retrieval → model answer, the scripted model slow) is
made once for the module; the tests replay it on isolated pipelines of their own topic prefixes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import struct
import sys
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from agentstream.replay.html import LANE_COLOURS, render
from agentstream.replay.rerun import ReplaySession, delete_topics, rerun
from agentstream.services.worker import WorkerOptions
from agentstream.streams.replay import timeline
from agentstream.streams.replay.diff import diff_runs
from agentstream.testing import Pipeline, isolated

pytestmark = pytest.mark.asyncio(loop_scope="module")
TOOLS = ("agentstream.services.tools.builtin", "tests.integration.pipeline_tools")
OPTIONS = WorkerOptions(backend="scripted", tool_modules=TOOLS)
DOC = "Zebras have black and white stripes; each zebra's pattern is unique."
#: Slow enough that a recorded rerun (~15-27 ms a step on a slow day for this machine) is 20x faster
#: with room to spare: the original's three model steps take 3.6 s, a rerun must finish within 180 ms.
SLOW_MS = 1200
#: model → tool (with a side effect) → model → retrieval → model answer (quoting the retrieval)
TASK = (f'[[slow:{SLOW_MS}]] [[tool:effect {{"label": "once"}}]] [[retrieve:zebra stripes]] '
        "Tell me about zebra stripes.")
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Original:
    run_id: str  # with the prefetch (the retrieval step is answered from it)
    no_prefetch: str  # the same task with prefetch off (its retrieval goes to the retrieval service)
    pipe: Pipeline


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def original(settings, effects_table):
    pipeline_settings = isolated(settings, f"t{uuid.uuid4().hex[:8]}.")
    try:
        async with Pipeline.start(pipeline_settings, OPTIONS) as pipe:
            pool = await pipe.client.pool()
            await pool.execute("""INSERT INTO documents (collection, source, content, content_hash)
                                  VALUES ('default', 'zebra.md', $1, $2) ON CONFLICT DO NOTHING""",
                               DOC, uuid.uuid4().hex)
            ids = [await pipe.client.submit(TASK, tools=["effect"], max_steps=8, prefetch=p) for p in (True, False)]
            results = await asyncio.gather(*(pipe.client.wait(r, timeout=60) for r in ids))
            assert all(r.ok and r.steps == 5 for r in results), results
            yield Original(ids[0], ids[1], pipe)
    finally:
        await delete_topics(pipeline_settings)


async def _effects(pipe: Pipeline, run_id: str) -> int:
    return await (await pipe.client.pool()).fetchval("SELECT count(*) FROM test_effects WHERE run_id = $1", run_id)


async def test_show_builds_the_timeline_and_verifies_every_event_in_kafka(original, settings):
    tl = await timeline.show(settings, original.run_id)
    assert tl is not None
    assert [(s.index, s.kind, s.service) for s in tl.steps] == [
        (-1, "prefetch", "retrieval"), (0, "model", "inference"), (1, "tool", "tools"), (2, "model", "inference"),
        (3, "retrieval", "retrieval"), (4, "model", "inference")]
    assert tl.steps[4].from_prefetch or tl.steps[3].from_prefetch
    counts = tl.kafka_counts()
    assert counts.get("verified", 0) >= 10 and not counts.get("missing") and not counts.get("mismatched"), counts
    for s in tl.steps:
        if s.kind == "model":
            assert s.compute_ms is not None and s.compute_ms >= SLOW_MS * 0.95, s
            assert s.queue_ms is not None and s.transport_ms is not None
            assert s.usage("prompt_tokens") > 0
    assert tl.steps[2].request == {"tool": "effect", "arguments": {"label": "once"}}
    budget = tl.budget()
    assert budget.compute_ms > 3 * SLOW_MS * 0.95 and budget.share(budget.compute_ms) > 0.8
    assert budget.planner_ms > 0 and budget.transport_ms > 0
    data = json.loads(json.dumps(tl.as_dict(), default=str))
    assert data["budget"]["wall_ms"] > 0 and len(data["spans"]) >= 10


@pytest.mark.slow
async def test_recorded_rerun_repeats_the_decisions_20x_faster_without_side_effects(original, settings):
    """Each rerun must repeat every decision and result with no side effect; the fastest of up to five
    (one session, as `replay window` runs them) must take at most 1/20 of the original's duration (the
    runs' own submitted → finished times). A rerun costs ~10-27 ms per step here (Kafka hops and the
    planner's commits) however slow the model was; retries absorb scheduling noise on a busy CI box."""
    original_ms = (await timeline.show(settings, original.run_id, check=False)).budget().wall_ms
    durations: list[float] = []
    pool = await original.pipe.client.pool()
    async with ReplaySession(settings, "recorded", OPTIONS) as session:
        for _ in range(5):
            result = await session.replay(original.run_id)
            assert result.finished and result.result.ok, result.result
            assert result.same_decisions, result.diff.to_dict()
            assert [s.status for s in result.diff.steps] == ["same"] * 6  # decisions AND results, prefetch too
            assert result.result.answer == result.original["answer"]
            assert await _effects(original.pipe, result.run_id) == 0  # the tool did not run again
            assert await pool.fetchval("SELECT replay_of FROM runs WHERE run_id = $1", result.run_id) == original.run_id
            durations.append(result.result.duration_ms)
            if result.result.duration_ms * 20 <= original_ms:
                break
    assert min(durations) * 20 <= original_ms, (durations, original_ms)
    assert await _effects(original.pipe, original.run_id) == 1
    # the session's topics are gone: its events are reported missing, not verified
    replayed = await timeline.show(settings, result.run_id)
    assert replayed is not None and replayed.run["replay_of"] == original.run_id
    counts = replayed.kafka_counts()
    assert counts.get("missing", 0) >= 10 and not counts.get("verified"), counts


@pytest.mark.slow
async def test_fork_from_step_2_keeps_steps_0_and_1_and_runs_live_from_2(original, settings):
    pool = await original.pipe.client.pool()
    # The world changed since the original: step 3 (live) finds this passage; step 4 quotes it.
    news = "Zebra stripes confuse biting flies, a 2019 study found."
    await pool.execute("""INSERT INTO documents (collection, source, content, content_hash)
                          VALUES ('default', 'zebra-news.md', $1, $2)""", news, uuid.uuid4().hex)
    try:
        result = await rerun(settings, original.no_prefetch, from_step=2, options=OPTIONS)
    finally:
        await pool.execute("DELETE FROM documents WHERE source = 'zebra-news.md'")
    assert result.finished and result.result.ok, result.result
    by_index = {s.index: s for s in result.diff.steps}
    assert by_index[0].status == "same" and by_index[1].status == "same"  # same decisions and results
    assert by_index[2].decision_a == by_index[2].decision_b  # the scripted model decides alike, live
    assert by_index[2].compute_ms_b is not None and by_index[2].compute_ms_b >= SLOW_MS * 0.95
    assert by_index[0].compute_ms_b is not None and by_index[0].compute_ms_b < SLOW_MS / 4  # from the record
    assert by_index[3].result_changed  # a live search of today's documents
    assert by_index[4].status == "changed"  # so the answer quoting it changed
    assert await _effects(original.pipe, result.run_id) == 0  # step 1's tool came from the record


async def test_diff_flags_a_changed_tool_argument(original, settings):
    pipe = original.pipe
    ids = [await pipe.client.submit(f'[[tool:calculator {{"expression": "{e}"}}]] [[answer:done]]',
                                    tools=["calculator"], prefetch=False) for e in ("6 * 7", "6 * 8")]
    assert all(r.ok for r in await asyncio.gather(*(pipe.client.wait(r, timeout=30) for r in ids)))
    found = await timeline.summaries(await pipe.client.pool(), ids)
    d = diff_runs(found[ids[0]], found[ids[1]])
    assert d.decisions_changed and d.changed_steps == [0, 1]
    assert d.steps[1].status == "changed" and any("6 * 8" in n for n in d.steps[1].notes)
    # the CLI: exit 1 and the same verdict as JSON; a run against itself exits 0
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url}
    for pair, code in (((ids[0], ids[1]), 1), ((ids[0], ids[0]), 0)):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "agentstream.cli", "replay", "diff", *pair, "--json", cwd=REPO, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, errors = await proc.communicate()
        assert proc.returncode == code, errors.decode()
        assert json.loads(out.decode().strip().splitlines()[-1])["decisions_changed"] is bool(code)
    # the cross-check notices a history row that points at the wrong record: swap two requests' offsets
    pool = await pipe.client.pool()
    rows = await pool.fetch("""SELECT event_id, "offset" FROM events WHERE run_id = $1
                               AND event_type = 'InferenceRequested' ORDER BY produced_at""", ids[1])
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute('UPDATE events SET "offset" = NULL WHERE event_id = $1', rows[0]["event_id"])
        await conn.execute('UPDATE events SET "offset" = $2 WHERE event_id = $1', rows[1]["event_id"], rows[0]["offset"])
        await conn.execute('UPDATE events SET "offset" = $2 WHERE event_id = $1', rows[0]["event_id"], rows[1]["offset"])
    tl = await timeline.show(settings, ids[1])
    assert tl.kafka_counts().get("mismatched") == 2, tl.kafka_counts()


async def test_a_replayed_request_without_a_recorded_counterpart_gets_an_error(original, settings):
    """Recorded mode with a tool the original never called: the planner's decision differs (here: the
    tool is not allowed, so the model is told), and the pipeline still finishes. In the same replay
    session, a turn of a conversation replays from the transcript recorded with it: the model sees what
    it saw then, whatever the session holds now."""
    client = original.pipe.client
    conversation = f"chat-{uuid.uuid4().hex[:6]}"
    turns = [await client.submit(text, tools=[], prefetch=False, session=conversation)
             for text in ("[[answer:alpha]] hello", "[[recall]] again")]
    assert (await client.wait(turns[1], timeout=30)).answer == "recall: alpha"
    later = await client.submit("[[answer:gamma]] later", tools=[], prefetch=False, session=conversation)
    assert (await client.wait(later, timeout=30)).ok  # the session has moved on since turn 2
    async with ReplaySession(settings, "recorded", OPTIONS) as session:
        result = await session.replay(original.no_prefetch, overrides=_no_tools())
        turn = await session.replay(turns[1])
    assert turn.result.answer == "recall: alpha" and turn.same_decisions, turn.diff.to_dict()
    pool = await client.pool()
    states = {r["run_id"]: json.loads(r["state"]) for r in await pool.fetch(
        "SELECT run_id, state::text AS state FROM runs WHERE run_id = ANY($1)", [turns[1], turn.run_id])}
    assert states[turn.run_id]["session_turns"] == states[turns[1]]["session_turns"]
    assert states[turn.run_id]["messages"] == states[turns[1]]["messages"]  # system, turn 1, turn 2's task, reply
    assert result.finished
    assert result.diff.decisions_changed  # step 1 is no longer the tool call
    steps = {s["index"]: s for s in result.rerun["steps"]}
    assert steps[1]["kind"] == "model" and "no recorded model step 1" in (steps[1]["error"] or "")


async def test_recorded_rerun_gives_the_recorded_approvals_again(original, settings):
    pipe = original.pipe
    run_id = await pipe.client.submit('[[tool:transfer {"amount": 5}]] [[answer:sent]]', tools=["transfer"],
                                      prefetch=False)
    for _ in range(200):
        waiting = [w for w in await pipe.client.awaiting_approval() if w["run_id"] == run_id]
        if waiting:
            break
        await asyncio.sleep(0.05)
    await pipe.client.approve(run_id, waiting[0]["step_id"], by="ana")
    assert (await pipe.client.wait(run_id, timeout=30)).ok
    result = await rerun(settings, run_id, options=OPTIONS, timeout=30)
    assert result.finished and result.result.answer == "sent" and result.same_decisions, result.diff.to_dict()
    assert await _effects(pipe, run_id) == 1 and await _effects(pipe, result.run_id) == 0


@pytest.mark.slow
async def test_window_reruns_live_against_a_candidate_prompt(original, settings):
    from datetime import UTC, datetime, timedelta

    from agentstream.replay.rerun import Overrides, window

    pipe = original.pipe
    since = datetime.now(UTC)
    ids = [await pipe.client.submit(f"What is {n} * 3?", tools=["calculator"], prefetch=False) for n in (4, 5)]
    assert all(r.ok for r in await asyncio.gather(*(pipe.client.wait(r, timeout=30) for r in ids)))
    out = await window(settings, since, datetime.now(UTC) + timedelta(seconds=1), mode="live",
                       overrides=Overrides(system_prompt="Be brief. " * 20), options=OPTIONS)
    assert out.originals == ids and not out.errors
    assert sorted(r.rerun["run_id"] for r in out.reruns) == sorted(r.run_id for r in out.reruns)
    report = out.report().to_dict()
    assert report["runs"] == 2 and report["decisions_changed"] == 0  # the scripted model ignores prompts
    assert report["completed"] == {"original": 2, "rerun": 2}
    assert report["tokens"]["delta"] > 0  # but the longer system prompt costs prompt tokens


def _no_tools():
    from agentstream.replay.rerun import Overrides

    return Overrides(tools=[])


# -- the HTML timeline in a real browser ----------------------------------------------------------

def _chromium() -> str | None:
    """Debian's ``chromium`` (``.ci/run`` installs it); the test is skipped, visibly, without one."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _png_rgb(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, unfiltered pixel rows) of an 8-bit RGB/RGBA PNG, pure Python."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
    raw = zlib.decompress(idat)
    stride = width * bpp
    out = bytearray(stride * height)
    prev = bytearray(stride)
    for y in range(height):
        f, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 1:
            for i in range(bpp, stride):
                row[i] = (row[i] + row[i - bpp]) & 255
        elif f == 2:
            row = bytearray((a + b) & 255 for a, b in zip(row, prev, strict=True))
        elif f == 3:
            for i in range(stride):
                row[i] = (row[i] + ((row[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
        elif f == 4:
            for i in range(stride):
                a, b = (row[i - bpp] if i >= bpp else 0), prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                row[i] = (row[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out[y * stride:(y + 1) * stride] = row
        prev = row
    return width, height, bpp, bytes(out)


@pytest.mark.slow
async def test_html_timeline_renders_a_lane_per_service_in_chromium(original, settings, tmp_path):
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does)")
    tl = await timeline.show(settings, original.no_prefetch)
    page = tmp_path / "timeline.html"
    page.write_text(render(tl), encoding="utf-8")
    text = page.read_text()
    for external in ("src=", "<link", "@import", "url(", "http://", "https://"):  # self-contained
        assert external not in text, external
    shot = tmp_path / "timeline.png"
    proc = await asyncio.create_subprocess_exec(
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,900", f"--screenshot={shot}",
        page.as_uri(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, errors = await asyncio.wait_for(proc.communicate(), 120)
    assert shot.exists(), errors.decode()[-2000:]
    width, height, bpp, pixels = await asyncio.to_thread(_png_rgb, shot.read_bytes())
    stride = width * bpp
    targets = {bytes.fromhex(colour[1:]): lane for lane, colour in LANE_COLOURS.items()}
    # Lane colours appear only in the chart: left of the plot (x < 140 on the page) the lane's swatch,
    # right of it the lane's bars (compute, planner work).
    swatch_ys: dict[str, list[int]] = {lane: [] for lane in LANE_COLOURS}
    bars: dict[str, int] = dict.fromkeys(LANE_COLOURS, 0)
    for y in range(height):
        line = pixels[y * stride:(y + 1) * stride]
        for x in range(0, stride, bpp):
            lane = targets.get(line[x:x + 3])
            if lane is None:
                continue
            if x // bpp < 140:
                swatch_ys[lane].append(y)
            else:
                bars[lane] += 1
    for lane in LANE_COLOURS:
        assert len(swatch_ys[lane]) >= 200, (lane, len(swatch_ys[lane]))  # the 16 x 16 swatch
        assert bars[lane] >= 60, (lane, bars)  # at least one bar (3 px wide at least, 28 px tall)
    centres = [sum(ys) / len(ys) for ys in swatch_ys.values()]
    # planner, inference, tools, retrieval, top to bottom, one lane (46 px) apart
    assert all(40 < b - a < 52 for a, b in itertools.pairwise(centres)), centres
    assert bars["inference"] > 20 * bars["tools"]  # the model's SLOW_MS per step against a quick tool
