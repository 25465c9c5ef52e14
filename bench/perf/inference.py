"""The llama.cpp engine alone versus the same requests through the pipeline (Kafka in, tokens out).

Engine alone: ``LlamaCppBackend`` (SmolLM2-135M, 8 slots) called in this process. Pipeline: the same
requests published as ``InferenceRequested`` to ``agent.inference.requests`` and served by an
``agentstream worker inference --backend llamacpp --slots 8`` process; this process reads the
``TokenChunk``s and ``InferenceCompleted``s back from Kafka. Both at 1, 4 and 8 concurrent requests:

- aggregate tok/s: completion tokens of a round over its wall time (pipeline: from publishing the
  round's requests to receiving its last completion);
- TTFT: request start to the first text (pipeline: publish → first TokenChunk received here);
- prefix-cache hit ratio: a 4-step conversation through the pipeline (one run, growing messages);
  cached prompt tokens over prompt tokens of steps 2-4, as llama.cpp reports them.

``ttft_added_p50_ms``: for each request through the pipeline, the TTFT seen here minus the TTFT the
engine itself reported for that same request (measured in the worker around the backend call): what
the request's hop into the service and the first token's hop back out add, without the engine's own
run-to-run variance. The table also shows the engine-alone TTFT at each level.

Both run with the same llama.cpp thread count, by default one core fewer than the machine has: the
broker, PostgreSQL and the worker's own Python share the machine, and llama.cpp's threads slow down
sharply when one of them is preempted (on 2 cores with 2 threads the pipeline gets about 70 % of the
idle engine's rate; see docs/benchmarks.md).

    .venv/bin/python -m bench.perf.inference [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition

from agentstream.devstack.stack import DevStack
from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
from agentstream.services.inference.backends.llamacpp import LlamaCppBackend
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import InferenceCompleted, InferenceRequested, Message, TokenChunk
from agentstream.streams.core.ids import step_id
from agentstream.streams.kafka.codec import codec_for
from agentstream.streams.kafka.topic_admin import ensure_topics
from agentstream.streams.kafka.topics import Topics
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.telemetry.backlog import prompt_tokens_header

ROOT = Path(__file__).resolve().parents[2]
SLOTS = 8
PROMPT = "Explain in a few sentences why the sky is blue, for a curious ten-year-old."
CONTEXT = ("You are a patient science teacher. Answer in plain words, with one everyday example, "
           "and keep each answer short. ") * 6


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# -- engine alone --------------------------------------------------------------------------------
async def engine_request(backend: LlamaCppBackend, n: int, max_tokens: int) -> tuple[Final, float]:
    request = GenerationRequest(request_id=f"e{n}", max_tokens=max_tokens,
                                messages=(ChatMessage(role="user", content=f"{PROMPT} (request {n})"),))
    t0 = time.perf_counter()
    ttft = None
    async for item in backend.generate(request):
        if isinstance(item, Delta) and ttft is None:
            ttft = (time.perf_counter() - t0) * 1000
        elif isinstance(item, Final):
            return item, ttft if ttft is not None else item.ttft_ms
    raise RuntimeError("no final record")


async def engine(levels: list[int], rounds: int, max_tokens: int,
                 threads: int | None) -> dict[int, tuple[float, list[float]]]:
    backend = LlamaCppBackend(slots=SLOTS, threads=threads)
    await backend.start()
    try:
        await engine_request(backend, -1, 8)
        out = {}
        for c in levels:
            tokens, wall, ttfts = 0, 0.0, []
            for r in range(rounds):
                t0 = time.perf_counter()
                done = await asyncio.gather(*(engine_request(backend, 1000 * c + 100 * r + i, max_tokens)
                                              for i in range(c)))
                wall += time.perf_counter() - t0
                tokens += sum(final.completion_tokens for final, _ in done)
                ttfts += [ttft for _, ttft in done]
            out[c] = (tokens / wall, ttfts)
        return out
    finally:
        await backend.close()


# -- through the pipeline --------------------------------------------------------------------------
class PipelineClient:
    """Publishes InferenceRequested and reads tokens and completions back from Kafka."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.runtime = Runtime(settings, codec_for(settings))
        self.runtime.add_header_hook(InferenceRequested, prompt_tokens_header)  # as the planner's requests
        self.topics = self.runtime.topics
        self.consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                                         fetch_max_wait_ms=50)
        self.first_token: dict[str, float] = {}
        self.waiting: dict[str, asyncio.Future[InferenceCompleted]] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        await self.runtime.start()
        await self.consumer.start()
        tps = [TopicPartition(t, p) for t in (self.topics.tokens, self.topics.inference_results)
               for p in range(self.settings.partitions)]
        self.consumer.assign(tps)
        ends = await self.consumer.end_offsets(tps)
        for tp in tps:
            self.consumer.seek(tp, ends[tp])
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for messages in batch.values():
                for msg in messages:
                    event = self.runtime.codec.decode(msg.value)
                    if isinstance(event, TokenChunk):
                        self.first_token.setdefault(event.step_id, now)
                    elif isinstance(event, InferenceCompleted) and event.step_id in self.waiting:
                        self.waiting.pop(event.step_id).set_result(event)

    async def request(self, run_id: str, messages: list[Message], max_tokens: int,
                      index: int = 0) -> tuple[float, InferenceCompleted]:
        """Publish one request; return (TTFT ms as seen here, the completion)."""
        event = InferenceRequested.build(run_id=run_id, step=step_id(run_id, index, "model"), service="bench",
                                         messages=messages, max_tokens=max_tokens, temperature=0.0)
        done = self.waiting[event.step_id] = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        await (await self.runtime.send(self.topics.inference_requests, event))
        completion = await done
        first = self.first_token.pop(event.step_id, None)
        return ((first - t0) * 1000 if first else completion.ttft_ms), completion

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
        await self.consumer.stop()
        await self.runtime.stop()


async def pipeline(settings: Settings, levels: list[int], rounds: int, max_tokens: int) -> dict:
    client = PipelineClient(settings)
    await client.start()
    try:
        await client.request(f"warm-{uuid.uuid4().hex[:6]}", [Message(role="user", content=PROMPT)], 8)
        out: dict = {}
        added: list[float] = []
        for c in levels:
            tokens, wall, ttfts = 0, 0.0, []
            for r in range(rounds):
                t0 = time.perf_counter()
                done = await asyncio.gather(*(
                    client.request(f"b-{uuid.uuid4().hex[:8]}",
                                   [Message(role="user", content=f"{PROMPT} (request {1000 * c + 100 * r + i})")],
                                   max_tokens) for i in range(c)))
                wall += time.perf_counter() - t0
                tokens += sum(completion.completion_tokens for _, completion in done)
                ttfts += [ttft for ttft, _ in done]
                added += [ttft - completion.ttft_ms for ttft, completion in done]
            out[c] = (tokens / wall, ttfts)
        out["ttft_added"] = added
        run_id = f"conv-{uuid.uuid4().hex[:8]}"  # one run, four steps: the prefix cache's case
        messages = [Message(role="system", content=CONTEXT), Message(role="user", content=PROMPT)]
        prompt, cached = 0, 0
        for index in range(4):
            _, completion = await client.request(run_id, messages, 24, index)
            if index:
                prompt += completion.prompt_tokens
                cached += completion.cached_prompt_tokens
            messages += [Message(role="assistant", content=completion.text), Message(role="user", content="Go on.")]
        out["prefix_cache_hit_ratio"] = cached / prompt if prompt else 0.0
        return out
    finally:
        await client.stop()


def start_worker(settings: Settings, threads: int | None) -> subprocess.Popen:
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap, "DATABASE_URL": settings.database_url,
           "AGENTSTREAM_TOPIC_PREFIX": settings.topic_prefix, "AGENTSTREAM_PARTITIONS": str(settings.partitions)}
    return subprocess.Popen([sys.executable, "-m", "agentstream.cli", "worker", "inference", "--backend", "llamacpp",
                             "--slots", str(SLOTS), *(["--threads", str(threads)] if threads else []),
                             "--log-level", "WARNING"], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one round per level, 32 tokens")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                        help="llama.cpp threads, for the engine alone and in the worker (default: one core "
                             "fewer than the machine has, which the broker and the services share)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()
    rounds, max_tokens = (1, 32) if args.quick else (4, 64)
    levels = [1, 4, 8]

    eng = asyncio.run(engine(levels, rounds, max_tokens, args.threads))
    status = DevStack().up()
    settings = replace(Settings.load(), kafka_bootstrap=status.kafka, database_url=status.database_url,
                       topic_prefix=f"benchinf{uuid.uuid4().hex[:6]}.")
    topics = Topics.of(settings)
    asyncio.run(ensure_topics(settings.kafka_bootstrap, topics.specs(), auth=settings.kafka_auth))
    worker = start_worker(settings, args.threads)
    try:
        pipe = asyncio.run(pipeline(settings, levels, rounds, max_tokens))
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        asyncio.run(topics.delete_all(settings.kafka_bootstrap, auth=settings.kafka_auth))

    print(f"SmolLM2-135M on llama.cpp, {SLOTS} slots, {args.threads} thread(s), {max_tokens} tokens per request, "
          f"{rounds} round(s) per level")
    print(f"{'concurrency':>12} {'engine tok/s':>13} {'pipeline tok/s':>15} {'ratio':>6} "
          f"{'engine TTFT p50/p99':>20} {'pipeline TTFT p50/p99':>22}")
    for c in levels:
        (e_rate, e_ttft), (p_rate, p_ttft) = eng[c], pipe[c]
        print(f"{c:>12} {e_rate:>13.1f} {p_rate:>15.1f} {p_rate / e_rate:>6.2f} "
              f"{percentile(e_ttft, 50):>9.0f} / {percentile(e_ttft, 99):<8.0f} "
              f"{percentile(p_ttft, 50):>10.0f} / {percentile(p_ttft, 99):<8.0f}")
    print(f"TTFT added by the pipeline (per request, vs the engine's own TTFT): p50 "
          f"{percentile(pipe['ttft_added'], 50):.1f} ms, p99 {percentile(pipe['ttft_added'], 99):.1f} ms")
    print(f"prefix-cache hit ratio over steps 2-4 of one run: {pipe['prefix_cache_hit_ratio']:.2f}")
    out = {
        "engine_tok_s_8": round(eng[8][0], 1),
        "pipeline_tok_s_8": round(pipe[8][0], 1),
        "pipeline_ratio_8": round(pipe[8][0] / eng[8][0], 3),
        "ttft_added_p50_ms": round(percentile(pipe["ttft_added"], 50), 1),  # as printed above
        "prefix_cache_hit_ratio": round(pipe["prefix_cache_hit_ratio"], 3),
    }
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
