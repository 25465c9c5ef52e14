"""The timeline as one self-contained HTML file: inline CSS, SVG and a few lines of JS; no CDN, no fonts
to fetch, so it opens offline and can be attached to a bug report as is.

Layout: the run's header, the speed-of-light budget as one stacked bar, a Gantt chart with one lane per
service (planner, inference, tools, retrieval; each in its own colour: a light bar for the queue wait, a
solid bar for compute, a grey bar for the transport back; planner work solid in the planner lane), then
the steps and the events with their Kafka cross-check. Lane colours are used nowhere else on the page,
so a screenshot can be checked for them (tests/integration/test_replay.py does).

The backbone's, like the rest of reading a run: ``agentstream replay show --html`` writes it to a file and
the HTTP gateway serves it (``GET /v1/runs/{id}/timeline``, which the web console shows).
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from html import escape
from typing import Any, TypeAlias

from agentstream.streams.replay.records import LANES, Step, Timeline

LANE_COLOURS = {"planner": "#7c3aed", "inference": "#2563eb", "tools": "#ea580c", "retrieval": "#16a34a"}
BUDGET_COLOURS = {"transport_and_queues": "#64748b", "compute": "#0f766e", "planner": "#a21caf", "other": "#cbd5e1"}
TRANSPORT = "#94a3b8"
WIDTH, LABEL_W, LANE_H, AXIS_H = 1300, 120, 46, 28

_CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px 24px;color:#0f172a;background:#fff}
h1{font-size:18px;margin:0 0 4px} .sub{color:#475569;margin:0 0 10px} .mono{font-family:ui-monospace,monospace;font-size:12px}
.budget{display:flex;height:22px;width:1300px;border-radius:4px;overflow:hidden;margin:6px 0 2px}
.budget div{height:100%} .legend span{display:inline-block;margin-right:14px;font-size:12px;color:#334155}
.legend i{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle;border-radius:2px}
table{border-collapse:collapse;margin:10px 0;font-size:12px} th,td{border-bottom:1px solid #e2e8f0;padding:3px 8px;
text-align:left;vertical-align:top} th{background:#f8fafc} td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.hl{background:#fef9c3} .ok{color:#15803d} .bad{color:#b91c1c} .warn{color:#b45309}
td.wrap{max-width:420px;word-break:break-word} svg text{font:12px system-ui,sans-serif;fill:#334155}
"""

_JS = """
document.querySelectorAll('[data-step]').forEach(function(el){el.addEventListener('click',function(){
 var row=document.getElementById('step-'+el.getAttribute('data-step'));if(!row)return;
 document.querySelectorAll('tr.hl').forEach(function(r){r.classList.remove('hl')});
 row.classList.add('hl');row.scrollIntoView({block:'center'});});});
"""


def _fmt(value: float | None, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _short(value: Any, limit: int = 160) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def gantt(tl: Timeline) -> str:
    """The SVG chart: a lane per service, bars for queue / compute / transport, a time axis in ms."""
    spans = tl.spans()
    total = max([tl.budget().wall_ms, *(s.end_ms for s in spans), 1.0])
    plot_w = WIDTH - LABEL_W - 10
    scale = plot_w / total
    height = AXIS_H + LANE_H * len(LANES) + 4
    parts = [f'<svg width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
             'aria-label="timeline" shape-rendering="crispEdges">']  # bars on whole pixels, even 3 px ones
    for k in range(11):  # the axis
        x = LABEL_W + plot_w * k / 10
        anchor = "end" if k == 10 else "middle"
        parts.append(f'<line x1="{x:.1f}" y1="{AXIS_H - 6}" x2="{x:.1f}" y2="{height}" stroke="#e2e8f0"/>'
                     f'<text x="{x:.1f}" y="{AXIS_H - 10}" text-anchor="{anchor}">{total * k / 10:.0f} ms</text>')
    for i, lane in enumerate(LANES):
        y, colour = AXIS_H + i * LANE_H, LANE_COLOURS[lane]
        parts.append(f'<rect class="lane" data-lane="{lane}" x="0" y="{y}" width="{WIDTH}" height="{LANE_H - 2}" '
                     f'fill="{colour}" fill-opacity="0.07"/>'
                     f'<rect x="8" y="{y + LANE_H / 2 - 8:.1f}" width="16" height="16" rx="3" fill="{colour}"/>'
                     f'<text x="30" y="{y + LANE_H / 2 + 4:.1f}" font-weight="600">{lane}</text>')
    lane_y = {lane: AXIS_H + i * LANE_H for i, lane in enumerate(LANES)}
    for s in spans:
        if s.lane not in lane_y:
            continue
        y, colour = lane_y[s.lane], LANE_COLOURS[s.lane]
        x = LABEL_W + max(0.0, s.start_ms) * scale
        w = max(3.0, (s.end_ms - s.start_ms) * scale)  # a 1 ms tool call stays visible
        if s.kind == "transport":
            attrs, top, h = f'fill="{TRANSPORT}"', y + LANE_H - 16, 8
        elif s.kind == "queue":
            attrs, top, h = f'fill="{colour}" fill-opacity="0.35"', y + 8, LANE_H - 18
        else:  # compute, planner
            attrs, top, h = f'fill="{colour}"', y + 8, LANE_H - 18
        if s.row is not None and s.kind != "transport":  # calls made side by side: one row each
            k, n = s.row
            h = max(2, (LANE_H - 18) // max(1, n))
            top = y + 8 + k * h
        step = f' data-step="{s.step}"' if s.step is not None else ""
        parts.append(f'<rect class="bar {s.kind}"{step} x="{x:.2f}" y="{top}" width="{w:.2f}" height="{h}" {attrs}>'
                     f'<title>{escape(s.label)} · {s.kind} {s.end_ms - s.start_ms:.1f} ms '
                     f'({s.start_ms:.1f} to {s.end_ms:.1f})</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


def _budget(tl: Timeline) -> str:
    b = tl.budget().as_dict()
    bars, legend = [], []
    names = {"transport_and_queues": "transport + queues", "compute": "compute", "planner": "planner",
             "other": "other (waits, approvals, skew)"}
    for key, name in names.items():
        share = b[f"{key}_share"]
        bars.append(f'<div style="width:{share * 100:.2f}%;background:{BUDGET_COLOURS[key]}" '
                    f'title="{name}: {b[key + "_ms"]:.1f} ms"></div>')
        legend.append(f'<span><i style="background:{BUDGET_COLOURS[key]}"></i>{name} '
                      f'{b[key + "_ms"]:.1f} ms ({share:.0%})</span>')
    return (f'<h2 style="font-size:15px;margin:12px 0 0">Speed-of-light budget · wall {b["wall_ms"]:.1f} ms</h2>'
            f'<div class="budget">{"".join(bars)}</div><div class="legend">{"".join(legend)}</div>')


def _detail(s: Step) -> tuple[str, str]:
    r = s.result or {}
    if s.kind == "model":
        return (f"{s.request.get('messages', '')} messages, model {s.request.get('model') or '-'}",
                _short(r.get("text", "")))
    if s.kind == "tool" and s.request.get("child_run_id"):  # a sub-agent's run
        return (f"{s.request.get('agent')}: {_short(s.request.get('task'))} (run {s.request['child_run_id']})",
                _short(r.get("result")) if r.get("ok") else "")
    if s.kind == "tool":
        return (f"{s.request.get('tool')}({_short(s.request.get('arguments', {}))})",
                _short(r.get("result")) if r.get("ok") else "")
    passages = r.get("passages") or []
    note = " (from prefetch)" if s.from_prefetch else ""
    return f"{_short(s.request.get('query', ''))}{note}", f"{len(passages)} passages"


def _steps(tl: Timeline) -> str:
    rows = ["<tr><th>#</th><th>kind</th><th>service</th><th>status</th><th>queue ms</th><th>compute ms</th>"
            "<th>back ms</th><th>tokens p/c/cached</th><th>TTFT ms</th><th>request</th><th>result / error</th></tr>"]
    for s in tl.steps:
        request, result = _detail(s)
        tokens = (f"{s.usage('prompt_tokens'):.0f}/{s.usage('completion_tokens'):.0f}/"
                  f"{s.usage('cached_prompt_tokens'):.0f}" if s.kind == "model" else "")
        ttft = _fmt(s.usage("ttft_ms")) if s.kind == "model" else ""
        status = f'<span class="{"ok" if s.status == "completed" else "bad"}">{escape(s.status)}</span>'
        shown = f'<span class="bad">{escape(s.error)}</span>' if s.error else escape(result)
        rows.append(f'<tr id="step-{s.index}"><td class="n">{s.index}</td><td>{escape(s.label.partition(" ")[2])}</td>'
                    f'<td>{s.service}</td><td>{status}</td><td class="n">{_fmt(s.queue_ms)}</td>'
                    f'<td class="n">{_fmt(s.compute_ms)}</td><td class="n">{_fmt(s.transport_ms)}</td>'
                    f'<td class="n">{tokens}</td><td class="n">{ttft}</td><td class="wrap mono">{escape(request)}</td>'
                    f'<td class="wrap mono">{shown}</td></tr>')
    return f"<table>{''.join(rows)}</table>"


def _events(tl: Timeline) -> str:
    css = {"verified": "ok", "missing": "warn", "mismatched": "bad"}
    rows = ["<tr><th>event</th><th>step</th><th>topic [partition] @ offset</th><th>produced</th><th>appended</th>"
            "<th>consumed</th><th>by</th><th>Kafka</th></tr>"]
    t0 = tl.start

    def rel(at: Any) -> str:
        return "" if at is None else f"+{(at - t0).total_seconds() * 1000:.1f}"

    for e in tl.events:
        where = escape(e.topic) + (f" [{e.partition}] @ {e.offset}" if e.offset is not None else "")
        rows.append(f'<tr><td>{escape(e.event_type)}</td><td class="mono">{escape(e.step_id or "")}</td>'
                    f'<td class="mono">{where}</td><td class="n">{rel(e.produced_at)}</td>'
                    f'<td class="n">{rel(e.appended_at)}</td><td class="n">{rel(e.consumed_at)}</td>'
                    f'<td>{escape(e.consumed_by or "")}</td><td class="{css.get(e.kafka, "")}" '
                    f'title="{escape(e.kafka_note)}">{escape(e.kafka)}</td></tr>')
    return f"<table>{''.join(rows)}</table>"


#: A tree of agents' timelines under a run: step index → (the child's timeline, its own children).
Children: TypeAlias = Mapping[int, tuple[Timeline, "Children"]]


def render(tl: Timeline, children: Children | None = None) -> str:
    """The whole page; ``children``: the timelines of the sub-agents' runs its steps started, drawn after
    the run's own, each under a heading naming the step (services/planner/subagents.py)."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(tl.run["run_id"])} timeline'
            f'</title><style>{_CSS}</style></head><body>{_body(tl)}{_children(children or {})}'
            f'<script>{_JS}</script></body></html>')


def _children(children: Children, depth: int = 1) -> str:
    out = []
    for index, (child, grandchildren) in children.items():
        out.append(f'<section style="margin-left:{24 * depth}px;border-left:3px solid #cbd5e1;padding-left:12px">'
                   f'<h2 style="font-size:15px;margin:18px 0 4px">└ step {index} ran a sub-agent</h2>'
                   f'{_body(child)}{_children(grandchildren, depth + 1)}</section>')
    return "".join(out)


def _body(tl: Timeline) -> str:
    """One run's heading, budget, timeline, steps and events."""
    run = tl.run
    outcome = (f'<span class="ok">answer: {escape(_short(run["answer"] or "", 200))}</span>'
               if run["status"] == "completed"
               else f'<span class="bad">{escape(run["status"])} {escape(run["error_code"] or "")}: '
                    f'{escape(_short(run["error"] or "", 200))}</span>')
    totals = tl.totals()
    counts = ", ".join(f"{v} {k}" for k, v in sorted(tl.kafka_counts().items()))
    replay_of = run["replay_of"]
    replay = f' · replay of <span class="mono">{escape(replay_of)}</span>' if replay_of else ""
    legend = ('<div class="legend"><span><i style="background:#475569;opacity:.35"></i>queue wait</span>'
              '<span><i style="background:#475569"></i>compute / planner work</span>'
              f'<span><i style="background:{TRANSPORT}"></i>transport back to the planner</span>'
              '<span>(click a bar for its step)</span></div>')
    return (f'<h1>{escape(run["run_id"])} · {escape(run["status"])}{replay}</h1>'
            f'<p class="sub">{escape(_short(run["task"], 300))}<br>{outcome} · {len(tl.steps)} steps · '
            f'tokens {totals["prompt_tokens"]} prompt / {totals["completion_tokens"]} completion '
            f'({totals["cached_prompt_tokens"]} cached) · TTFT p50 {_fmt(totals["ttft_p50_ms"])} ms · '
            f'Kafka check: {escape(counts)}</p>'
            f'{_budget(tl)}<h2 style="font-size:15px;margin:14px 0 4px">Timeline</h2>{legend}{gantt(tl)}'
            f'<h2 style="font-size:15px;margin:14px 0 0">Steps</h2>{_steps(tl)}'
            f'<h2 style="font-size:15px;margin:14px 0 0">Events</h2>{_events(tl)}')


def script_source() -> str:
    """The page's one inline script as a Content-Security-Policy source (``'sha256-…'``): a page that shows
    the timeline under a policy without ``'unsafe-inline'`` (the gateway's web console) allows it by this."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(_JS.encode()).digest()).decode() + "'"


__all__ = ["BUDGET_COLOURS", "LANE_COLOURS", "TRANSPORT", "Children", "gantt", "render", "script_source"]
