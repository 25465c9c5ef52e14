"""The HTTP gateway under load (issue 33): submissions per second, many SSE streams, and what it adds to a run.

One gateway process (`agentstream worker gateway`) in front of the four services in one process of their
own (scripted model), on the stack `agentstream dev up` runs, under a topic prefix of their own. This
process is the clients (aiohttp). Three measurements:

1. ``submit``: ``--submits`` tasks through ``POST /v1/runs`` with ``--submit-concurrency`` requests in
   flight: accepted runs per second, and the gateway's CPU per submission.
2. ``streams`` (the workers restarted with a model that writes 8 characters every 50 ms): ``--runs`` runs
   whose model waits a few seconds before it writes (their starts spread over ``--spread`` seconds),
   then ``--streams`` SSE
   streams opened on them (``/v1/runs/{id}/events``, spread evenly) while they wait: the gateway's RSS
   before and after (memory per open stream); then every token each stream receives, from its record's
   timestamp (the inference service's) to this client reading it: p50/p99/max (the client shares the
   machine's cores with the gateway, the workers, the broker and PostgreSQL: its own queueing is in it);
   and the gateway's own histograms (``/metrics``): the record to the SSE write, and the record to the
   live fan-out handing it out (the producer's and Kafka's part).
3. ``latency``: ``--sequential`` rounds of one-step runs one at a time, alternating: the gateway's chat
   completion (one request: submit and wait for the answer) against the Python client's submit and wait,
   and the gateway's ``POST /v1/runs`` then its SSE stream to the outcome against the client's again
   (without the speculative retrieval, as that POST asks); p50/p90 of each and what the gateway adds.

    .venv/bin/python -m bench.perf.gateway [--streams 1000] [--runs 100] [--submits 2000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import aiohttp

from agentstream.devstack.process import free_port
from agentstream.devstack.stack import DevStack
from agentstream.streams.client.agent_client import AgentClient
from agentstream.streams.config.settings import Settings
from agentstream.streams.kafka.topics import Topics
from bench.perf.pipeline import percentile, wait_ready
from bench.perf.proc_cpu import cpu_seconds

ROOT = Path(__file__).resolve().parents[2]
CHUNK_CHARS, CHUNK_DELAY_S = 8, 0.05
ANSWER = "The gateway streams this answer to many readers at once, a few characters at a time, as written."


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def run_workers(prefix: str, chunked: bool) -> None:
    """The four services in this process (``--workers-only``); ``chunked``: a scripted model that writes its
    reply a few characters at a time (the streams), else all at once (submissions, latency)."""
    from agentstream.services.worker import SERVICES, WorkerOptions, serve

    settings = replace(Settings.load(), topic_prefix=prefix)
    chunks = {"chunk_chars": CHUNK_CHARS, "chunk_delay_s": CHUNK_DELAY_S} if chunked else {}
    await serve(SERVICES, WorkerOptions(backend="scripted", backend_options={"slots": 256, **chunks}), settings)


def start_workers(env: dict[str, str], prefix: str, chunked: bool, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.perf.gateway", "--workers-only", prefix,
                             *(["--chunked"] if chunked else [])], env=env, cwd=ROOT, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def client_submit_rate(settings: Settings, total: int, concurrency: int) -> dict:
    """The same submissions through the Python client, for comparison: what Kafka and the client allow."""
    done = 0
    async with AgentClient(settings) as client:
        for _ in range(50):
            client.forget(await client.submit("[[answer:ok]]", tools=[], prefetch=False))

        async def one() -> None:
            nonlocal done
            while done < total:
                done += 1
                client.forget(await client.submit("[[answer:ok]]", tools=[], prefetch=False))

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"client_runs_per_s": round(total / wall, 1)}


async def make_token(settings: Settings) -> str:
    import asyncpg

    from agentstream.services.gateway.tokens import Role, create
    from agentstream.streams.store import migrations

    await migrations.migrate(settings.database_url)
    conn = await asyncpg.connect(settings.database_url)
    try:
        return (await create(conn, tenant="default", role=Role.SUBMITTER, name="bench"))[0]
    finally:
        await conn.close()


async def revoke_token(settings: Settings, token: str) -> None:
    import asyncpg

    from agentstream.services.gateway.tokens import revoke

    conn = await asyncpg.connect(settings.database_url)
    try:
        await revoke(conn, token)
    finally:
        await conn.close()


async def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"{url}/readyz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the gateway did not become ready")
            await asyncio.sleep(0.2)


async def submit_rate(url: str, token: str, total: int, concurrency: int, gateway_pid: int) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    body = {"task": "[[answer:ok]]", "prefetch": False, "tools": []}
    done = 0
    failures = 0
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(50):  # warm the gateway's cell, client and connections
            async with http.post(f"{url}/v1/runs", json=body, headers=headers) as r:
                await r.read()

        async def one() -> None:
            nonlocal done, failures
            while done < total:
                done += 1
                started = time.perf_counter()
                async with http.post(f"{url}/v1/runs", json=body, headers=headers) as r:
                    await r.read()
                    if r.status != 202:
                        failures += 1
                latencies.append((time.perf_counter() - started) * 1000)

        cpu0 = cpu_seconds([gateway_pid])
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds([gateway_pid]) - cpu0
    return {"submits": total, "concurrency": concurrency, "runs_per_s": round(total / wall, 1),
            "request_p50_ms": round(percentile(latencies, 50), 2), "request_p99_ms": round(percentile(latencies, 99), 2),
            "gateway_cpu_ms_per_submit": round(cpu * 1000 / total, 3), "failures": failures}


async def histograms(url: str) -> dict[str, list[tuple[float, float]]]:
    """The gateway's histograms (``/metrics``): name -> [(upper bound, cumulative count)]."""
    out: dict[str, list[tuple[float, float]]] = {}
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
        for line in (await r.text()).splitlines():
            if "_bucket{le=" in line:
                name, _, rest = line.partition("_bucket{le=\"")
                bound, _, count = rest.partition("\"} ")
                out.setdefault(name, []).append((float(bound), float(count)))
    return out


def quantile(before: list[tuple[float, float]], after: list[tuple[float, float]], q: float) -> float | None:
    """The q-quantile (ms) of the observations between two scrapes, interpolated within its bucket."""
    counts = [(b, a - c) for (b, a), (_, c) in zip(after, before, strict=True)]
    total = counts[-1][1]
    if not total:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in counts:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower * 1000
            return (lower + (bound - lower) * (rank - below) / max(cumulative - below, 1e-9)) * 1000
        lower, below = bound, cumulative
    return None


async def streams(url: str, token: str, runs: int, count: int, gateway_pid: int, spread_s: float) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    wait_ms = 4000 + count * 6  # the model waits while the streams connect
    bodies = [{"task": f"[[slow:{wait_ms + int(spread_s * 1000 * i / runs)}]] [[answer:{ANSWER}]]", "prefetch": False,
               "tools": []} for i in range(runs)]
    delays: list[float] = []
    received = [0] * count
    connected = 0
    ended = 0
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
        run_ids = []
        for body in bodies:
            async with http.post(f"{url}/v1/runs", json=body, headers=headers) as r:
                run_ids.append((await r.json())["run_id"])
        await asyncio.sleep(1.0)
        rss_before = rss_mib(gateway_pid)
        all_connected = asyncio.Event()

        async def follow(i: int) -> None:
            nonlocal connected, ended
            run_id = run_ids[i % runs]
            async with http.get(f"{url}/v1/runs/{run_id}/events", headers=headers) as r:
                assert r.status == 200, await r.text()
                connected += 1
                if connected == count:
                    all_connected.set()
                event = ""
                async for raw in r.content:
                    line = raw.decode()
                    if line.startswith("event: "):
                        event = line[7:].strip()
                    elif line.startswith("data: ") and event == "token":
                        delays.append(time.time() * 1000 - json.loads(line[6:])["time_ms"])
                        received[i] += 1
            ended += 1

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(follow(i)) for i in range(count)]
        await asyncio.wait_for(all_connected.wait(), wait_ms / 1000)
        connect_s = time.perf_counter() - t0
        await asyncio.sleep(0.5)
        rss_open = rss_mib(gateway_pid)
        cpu0, mine0, t1 = cpu_seconds([gateway_pid]), cpu_seconds([os.getpid()]), time.perf_counter()
        hist0 = await histograms(url)
        results = await asyncio.gather(*tasks, return_exceptions=True)
        cpu, mine, wall = (cpu_seconds([gateway_pid]) - cpu0, cpu_seconds([os.getpid()]) - mine0,
                           time.perf_counter() - t1)
    hist1 = await histograms(url)
    served = {name: {f"p{q}": round(v, 1) if (v := quantile(hist0[f"agentstream_gateway_{name}_seconds"],
                                                          hist1[f"agentstream_gateway_{name}_seconds"], q / 100))
                     is not None else None for q in (50, 99)} for name in ("token_delivery", "hub_lag")}
    errors = [r for r in results if isinstance(r, BaseException)]
    expected = -(-len(ANSWER.replace('"', '\\"')) // CHUNK_CHARS)  # roughly: the reply is JSON around the answer
    return {"streams": count, "runs": runs, "connect_s": round(connect_s, 2), "rss_before_mib": round(rss_before, 1),
            "rss_open_mib": round(rss_open, 1), "kib_per_stream": round((rss_open - rss_before) * 1024 / count, 1),
            "tokens_received": sum(received), "tokens_per_stream_min": min(received), "chunks_expected_at_least": expected,
            "delivery_p50_ms": round(percentile(delays, 50), 1) if delays else None,
            "delivery_p99_ms": round(percentile(delays, 99), 1) if delays else None,
            "delivery_max_ms": round(max(delays), 1) if delays else None, "errors": len(errors),
            "spread_s": spread_s, "gateway_token_delivery_ms": served["token_delivery"],
            "gateway_hub_lag_ms": served["hub_lag"],
            "gateway_cpu_s": round(cpu, 2), "client_cpu_s": round(mine, 2), "streaming_wall_s": round(wall, 2)}


async def latency(url: str, token: str, settings: Settings, rounds: int) -> dict:
    """One-step runs one at a time, alternating: a chat completion against the Python client's submit and
    wait of the same task (speculative retrieval on, as chat runs have it), and ``POST /v1/runs`` then its
    SSE stream to the outcome against the client's with retrieval off (as the POST asks)."""
    headers = {"Authorization": f"Bearer {token}"}
    times: dict[str, list[float]] = {"client": [], "chat": [], "client_noprefetch": [], "runs_sse": []}
    chat = {"model": "agentstream", "messages": [{"role": "user", "content": "[[answer:ok]]"}]}
    async with AgentClient(settings) as client, aiohttp.ClientSession() as http:
        async def by_client(prefetch: bool) -> None:
            t = time.perf_counter()
            run_id = await client.submit("[[answer:ok]]", prefetch=prefetch)
            await client.wait(run_id, timeout=30)
            times["client" if prefetch else "client_noprefetch"].append((time.perf_counter() - t) * 1000)

        async def by_chat() -> None:
            t = time.perf_counter()
            async with http.post(f"{url}/v1/chat/completions", json=chat, headers=headers) as r:
                assert r.status == 200, await r.text()
                await r.read()
            times["chat"].append((time.perf_counter() - t) * 1000)

        async def by_sse() -> None:
            t = time.perf_counter()
            async with http.post(f"{url}/v1/runs", json={"task": "[[answer:ok]]", "prefetch": False},
                                 headers=headers) as r:
                run_id = (await r.json())["run_id"]
            async with http.get(f"{url}/v1/runs/{run_id}/events", headers=headers) as r:
                async for raw in r.content:
                    if raw.startswith(b"event: outcome"):
                        break
            times["runs_sse"].append((time.perf_counter() - t) * 1000)

        async def round_() -> None:
            await by_client(True)
            await by_chat()
            await by_client(False)
            await by_sse()

        for _ in range(10):  # warm-up
            await round_()
        for values in times.values():
            values.clear()
        for _ in range(rounds):
            await round_()
    p50 = {k: statistics.median(v) for k, v in times.items()}
    out: dict = {"rounds": rounds}
    for kind, values in times.items():
        out[f"{kind}_p50_ms"] = round(p50[kind], 2)
        out[f"{kind}_p90_ms"] = round(percentile(values, 90), 2)
    out["chat_added_p50_ms"] = round(p50["chat"] - p50["client"], 2)
    out["runs_sse_added_p50_ms"] = round(p50["runs_sse"] - p50["client_noprefetch"], 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=100, help="runs the streams follow")
    parser.add_argument("--spread", type=float, default=4.0,
                        help="seconds over which the runs start writing (0: all at the same moment)")
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--submit-concurrency", type=int, default=32)
    parser.add_argument("--sequential", type=int, default=100, help="runs of each kind, one at a time")
    parser.add_argument("--only", choices=["submit", "streams", "latency"], action="append")
    parser.add_argument("--workers-only", metavar="PREFIX", help=argparse.SUPPRESS)
    parser.add_argument("--chunked", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    if args.workers_only:
        from agentstream.cli.common import run_async

        run_async(run_workers(args.workers_only, args.chunked))
        return
    status = DevStack().up()
    settings = replace(Settings.load(), kafka_bootstrap=status.kafka, database_url=status.database_url,
                       topic_prefix=f"gwbench{uuid.uuid4().hex[:6]}.")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url,
           "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix, "AGENTSTREAM_PARTITIONS": str(settings.partitions),
           "AGENTSTREAM_GATEWAY_RATE_PER_S": "1000000", "AGENTSTREAM_GATEWAY_BURST": "1000000",
           "AGENTSTREAM_GATEWAY_MAX_STREAMS": str(max(2000, args.streams + 100)),
           "AGENTSTREAM_GATEWAY_MAX_IN_FLIGHT": "4096"}
    log_dir = Path(os.environ.get("TMPDIR", "/tmp"))
    workers = start_workers(env, settings.topic_prefix, False, log_dir / "gwbench-workers.log")
    gateway = subprocess.Popen([sys.executable, "-m", "agentstream.cli", "worker", "gateway", "--port", str(port),
                                "--log-level", "WARNING"], env=env, cwd=ROOT,
                               stdout=open(log_dir / "gwbench-gateway.log", "ab"), stderr=subprocess.STDOUT)
    only = set(args.only or ["submit", "streams", "latency"])
    out: dict = {"machine": f"{os.cpu_count()} CPUs, shared by the broker, PostgreSQL, the workers, the gateway and "
                            "this client"}
    token = ""
    try:
        asyncio.run(wait_ready(settings))
        token = asyncio.run(make_token(settings))
        asyncio.run(wait_http(url))
        if "submit" in only:
            out["submit"] = asyncio.run(submit_rate(url, token, args.submits, args.submit_concurrency, gateway.pid))
            out["submit"].update(asyncio.run(client_submit_rate(settings, args.submits, args.submit_concurrency)))
            print("submit", out["submit"], flush=True)
        if "latency" in only:
            out["latency"] = asyncio.run(latency(url, token, settings, args.sequential))
            print("latency", out["latency"], flush=True)
        if "streams" in only:
            stop([workers])  # the same workers, with a model that writes a few characters at a time
            workers = start_workers(env, settings.topic_prefix, True, log_dir / "gwbench-workers.log")
            asyncio.run(wait_ready(settings))
            out["streams"] = asyncio.run(streams(url, token, args.runs, args.streams, gateway.pid, args.spread))
            print("streams", out["streams"], flush=True)
    finally:
        stop([gateway, workers])
        if token:
            asyncio.run(revoke_token(settings, token))  # the bench's token is not left valid on the stack
        topics = Topics(prefix=settings.topic_prefix, partitions=settings.partitions)
        asyncio.run(topics.delete_all(settings.kafka_bootstrap, auth=settings.kafka_auth))
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
