"""The llama.cpp backend alone (no Kafka): aggregate decode throughput at 1, 4 and 8 concurrent streams.

Each stream asks for ``--max-tokens`` tokens of a fixed prompt (with a per-request suffix, so only the
shared prefix is cached). ``tok_s_N`` is all streams' completion tokens divided by the wall time of the
round; 1 and 4 streams run on a 4-slot engine, 8 streams on an 8-slot one. ``ttft_p50_ms`` is the median
time to first token over every measured request.

    .venv/bin/python bench/llamacpp_engine.py [--rounds 2] [--max-tokens 64] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from services.inference.backends.base import ChatMessage, Final, GenerationRequest
from services.inference.backends.llamacpp import LlamaCppBackend

PROMPT = "Explain in a few sentences why the sky is blue, for a curious ten-year-old."


async def _one(backend: LlamaCppBackend, n: int, max_tokens: int) -> Final:
    request = GenerationRequest(
        request_id=f"bench-{n}",
        messages=(ChatMessage(role="user", content=f"{PROMPT} (request {n})"),),
        max_tokens=max_tokens,
    )
    async for item in backend.generate(request):
        if isinstance(item, Final):
            return item
    raise RuntimeError("no Final")


async def _measure(
    backend: LlamaCppBackend, streams: int, rounds: int, max_tokens: int, ttfts: list[float]
) -> float:
    await _one(backend, -1, 8)  # warm-up: caches the shared prefix
    tokens, wall = 0, 0.0
    for r in range(rounds):
        t0 = time.perf_counter()
        finals = await asyncio.gather(*(_one(backend, r * 100 + i, max_tokens) for i in range(streams)))
        wall += time.perf_counter() - t0
        tokens += sum(f.completion_tokens for f in finals)
        ttfts.extend(f.ttft_ms for f in finals)
    return tokens / wall


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    args = parser.parse_args()

    ttfts: list[float] = []
    result: dict[str, float] = {}
    for slots, streams_list in ((4, (1, 4)), (8, (8,))):
        backend = LlamaCppBackend(slots=slots, threads=args.threads)
        t0 = time.perf_counter()
        await backend.start()
        result[f"load_s_{slots}_slots"] = round(time.perf_counter() - t0, 2)
        try:
            for streams in streams_list:
                tok_s = await _measure(backend, streams, args.rounds, args.max_tokens, ttfts)
                result[f"tok_s_{streams}"] = round(tok_s, 1)
                print(f"{streams} stream(s), {slots} slots: {tok_s:.1f} tok/s aggregate")
        finally:
            await backend.close()
    result["ttft_p50_ms"] = round(statistics.median(ttfts), 1)
    print(f"ttft p50: {result['ttft_p50_ms']} ms over {len(ttfts)} requests")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
