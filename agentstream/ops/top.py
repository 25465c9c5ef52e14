"""``agentstream top``: a live terminal dashboard of the workers' ``/metrics`` endpoints.

Per worker: steps/s by service, runs/s, consumer lag, the inference backlog (prompt tokens), TTFT,
tokens/s, prefix-cache hits and errors/s, with a total row. Rates are differences between two scrapes
``--interval`` apart. Endpoints come from ``--endpoints host:port,…`` or, by default, from the workers'
registrations in PostgreSQL (``workers`` table: every worker serving metrics under this topic prefix).

``--once`` prints one snapshot (two scrapes, one interval apart) and exits; tests use it.

``agentstream top`` (agentstream/cli/ops.py) calls ``run_top``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table

from agentstream.streams.config.settings import Settings
from agentstream.streams.telemetry.discovery import discover

SERVICES = ("planner", "inference", "retrieval", "tools")
Labels = tuple[tuple[str, str], ...]


@dataclass
class Scrape:
    """One scrape of one endpoint: every sample by name, with its labels."""

    url: str
    at: float
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    error: str | None = None

    def total(self, name: str, **match: str | Collection[str]) -> float:
        """Sum of the samples called ``name`` whose labels match (a value or a set of values)."""
        out = 0.0
        for labels, value in self.samples.get(name, ()):
            if all((labels.get(k) in v) if not isinstance(v, str) else labels.get(k) == v for k, v in match.items()):
                out += value
        return out

    def label(self, name: str, key: str) -> str | None:
        for labels, _ in self.samples.get(name, ()):
            if key in labels:
                return labels[key]
        return None


def parse(url: str, text: str, at: float | None = None) -> Scrape:
    scrape = Scrape(url=url, at=time.monotonic() if at is None else at)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            scrape.samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return scrape


async def scrape_all(session: aiohttp.ClientSession, urls: Sequence[str]) -> list[Scrape]:
    async def one(url: str) -> Scrape:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as response:
                response.raise_for_status()
                return parse(url, await response.text())
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return Scrape(url=url, at=time.monotonic(), error=f"{type(exc).__name__}: {exc}"[:80])

    return list(await asyncio.gather(*(one(u) for u in urls)))


@dataclass
class Row:
    """What the dashboard shows for one worker (or the total)."""

    name: str
    services: str = ""
    steps_per_s: dict[str, float] = field(default_factory=dict)
    runs_per_s: float = 0.0
    lag: float = 0.0
    backlog_tokens: float = 0.0
    in_flight: float = 0.0
    ttft_ms: float | None = None
    tokens_per_s: float = 0.0
    cache_hit: float | None = None
    errors_per_s: float = 0.0
    errors_total: float = 0.0
    error: str | None = None


_ERRORS = ("agentstream_handler_errors_total", "agentstream_dead_letters_total", "agentstream_inference_errors_total")


def row(before: Scrape, after: Scrape) -> Row:
    """Rates between two scrapes of one endpoint, and its current gauges."""
    r = Row(name=after.url.removeprefix("http://").removesuffix("/metrics"),
            services=after.label("agentstream_worker_info", "services") or "")
    if after.error or before.error:
        r.error = after.error or before.error
        return r
    dt = max(after.at - before.at, 1e-6)

    def rate(name: str, **match: str | Collection[str]) -> float:
        return max(0.0, after.total(name, **match) - before.total(name, **match)) / dt

    for service in SERVICES:
        r.steps_per_s[service] = rate("agentstream_handle_seconds_count", service=service)
    r.runs_per_s = rate("agentstream_events_emitted_total", service="planner", event_type={"RunCompleted", "RunFailed"})
    r.lag = after.total("agentstream_consumer_lag")
    r.backlog_tokens = after.total("agentstream_inference_backlog_prompt_tokens")
    r.in_flight = after.total("agentstream_in_flight")
    count = after.total("agentstream_ttft_seconds_count") - before.total("agentstream_ttft_seconds_count")
    if count > 0:
        r.ttft_ms = 1000 * (after.total("agentstream_ttft_seconds_sum") - before.total("agentstream_ttft_seconds_sum")) / count
    r.tokens_per_s = rate("agentstream_completion_tokens_total")
    prompt = after.total("agentstream_prompt_tokens_total") - before.total("agentstream_prompt_tokens_total")
    if prompt > 0:
        cached = after.total("agentstream_cached_prompt_tokens_total") - before.total("agentstream_cached_prompt_tokens_total")
        r.cache_hit = cached / prompt
    r.errors_per_s = sum(rate(n) for n in _ERRORS)
    r.errors_total = sum(after.total(n) for n in _ERRORS)
    return r


def total(rows: Sequence[Row]) -> Row:
    t = Row(name="total")
    ok = [r for r in rows if r.error is None]
    for service in SERVICES:
        t.steps_per_s[service] = sum(r.steps_per_s.get(service, 0.0) for r in ok)
    for attr in ("runs_per_s", "lag", "backlog_tokens", "in_flight", "tokens_per_s", "errors_per_s", "errors_total"):
        setattr(t, attr, sum(getattr(r, attr) for r in ok))
    ttfts = [r.ttft_ms for r in ok if r.ttft_ms is not None]
    t.ttft_ms = sum(ttfts) / len(ttfts) if ttfts else None
    hits = [r.cache_hit for r in ok if r.cache_hit is not None]
    t.cache_hit = sum(hits) / len(hits) if hits else None
    return t


def render(rows: Sequence[Row], title: str = "agentstream top") -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("worker", no_wrap=True)
    table.add_column("services")
    for service in SERVICES:
        table.add_column(f"{service}\nsteps/s", justify="right")
    for name in ("runs/s", "lag", "backlog\ntokens", "in\nflight", "TTFT\nms", "tokens/s", "cache\nhits",
                 "errors/s", "errors"):
        table.add_column(name, justify="right")

    def cells(r: Row) -> list[str]:
        if r.error is not None:
            return [r.name, r.services, f"[red]{r.error}[/red]"] + [""] * (len(SERVICES) + 8)
        return [r.name, r.services, *(f"{r.steps_per_s.get(s, 0.0):.1f}" for s in SERVICES), f"{r.runs_per_s:.1f}",
                f"{r.lag:.0f}", f"{r.backlog_tokens:.0f}", f"{r.in_flight:.0f}",
                "—" if r.ttft_ms is None else f"{r.ttft_ms:.0f}", f"{r.tokens_per_s:.1f}",
                "—" if r.cache_hit is None else f"{r.cache_hit:.0%}",
                f"{r.errors_per_s:.2f}", f"{r.errors_total:.0f}"]

    for r in rows:
        table.add_row(*cells(r))
    if len(rows) > 1:
        table.add_row(*cells(total(rows)), style="bold")
    return table


def endpoint_urls(endpoints: str) -> list[str]:
    """``host:port,…`` (or full URLs) → metrics URLs."""
    urls = []
    for item in filter(None, (e.strip() for e in endpoints.split(","))):
        url = item if "://" in item else f"http://{item}"
        urls.append(url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics")
    return urls


async def find_endpoints(endpoints: str | None, settings: Settings) -> list[str]:
    if endpoints:
        return endpoint_urls(endpoints)
    return [url for url, _services in await discover(settings.database_url, settings.topic_prefix)]


async def snapshot(urls: Sequence[str], interval: float) -> list[Row]:
    """Two scrapes ``interval`` apart: one row per endpoint."""
    async with aiohttp.ClientSession() as session:
        before = await scrape_all(session, urls)
        await asyncio.sleep(interval)
        after = await scrape_all(session, urls)
    return [row(b, a) for b, a in zip(before, after, strict=True)]


async def run_top(endpoints: str | None, interval: float, once: bool, console: Console,
                  settings: Settings | None = None) -> int:
    """The dashboard; returns the exit status (1 when no worker was found)."""
    settings = settings or Settings.load()
    urls = await find_endpoints(endpoints, settings)
    if not urls:
        console.print("no workers found: start them with a metrics port (AGENTSTREAM_METRICS_PORT or "
                      "--metrics-port), or give --endpoints host:port,…")
        return 1
    if once:
        console.print(render(await snapshot(urls, interval)))
        return 0
    async with aiohttp.ClientSession() as session:
        previous = {s.url: s for s in await scrape_all(session, urls)}
        rediscovered = time.monotonic()
        with Live(render([]), console=console, refresh_per_second=4, screen=False) as live:
            while True:
                await asyncio.sleep(interval)
                if endpoints is None and time.monotonic() - rediscovered > 10:
                    urls = await find_endpoints(None, settings) or urls
                    rediscovered = time.monotonic()
                current = await scrape_all(session, urls)
                rows = [row(previous.get(s.url, s), s) for s in current]
                live.update(render(rows, f"agentstream top · {len(urls)} workers · every {interval:g} s"))
                previous = {s.url: s for s in current}


__all__ = ["Row", "Scrape", "endpoint_urls", "parse", "render", "row", "run_top", "snapshot"]
