"""What conversations cost: loading a session's transcript per turn, and a turn's time to first token on the
CPU model with and without the earlier turns' KV prefix reused.

1. ``load``: the planner's reads when a turn of a session arrives (services/planner/sessions.py ``admit``):
   the session's row (its transcript) and its turns still going, then the transcript parsed and cut to the
   token budget. On the dev stack's PostgreSQL, for sessions of 0 to 32 turns; p50 and p95 per turn.
2. ``pipeline``: the same through the whole pipeline (in-process workers, scripted model: the model costs
   nothing, so the difference is ours): one-step runs on their own against one-step turns of one
   conversation, alternated, submit to outcome. ``added_p50_ms`` is the turns' p50 minus the runs'.
3. ``kv`` (``--kv``): a 5-turn conversation on the CPU model (llama.cpp, SmolLM2-135M, one slot), each
   turn's first model request exactly as the planner builds it (``machine.begin`` from the transcript the
   turns before left, with the replies the model gave). TTFT per turn with the prompt cache on (the
   conversation's prefix is reused: llama.cpp keeps the slot's KV and picks the slot with the longest
   common prefix) against the same requests with ``cache_prompt`` off; and the prompt tokens llama.cpp
   reports as cached.

    .venv/bin/python -m bench.perf.sessions [--turns 40] [--kv [--kv-rounds 3]] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import asyncpg

from agentstream.services.planner import machine
from agentstream.services.planner.transcript import Transcript, Turn
from agentstream.services.worker import WorkerOptions
from agentstream.streams.config.sessions import DEFAULT_TOKEN_BUDGET
from agentstream.streams.config.settings import Settings
from agentstream.streams.core.events import TaskSubmitted
from agentstream.streams.core.tools import ToolInfo
from agentstream.streams.store import sessions as store
from agentstream.testing import Pipeline, isolated

SIZES = (0, 4, 16, 32)
LOAD_ROUNDS = 400
QUESTIONS = ("My name is Ada and I keep bees in Lyon.", "How many hives should a beginner start with?",
             "What do the bees need in winter?", "And what was my name again?", "Where do I live?")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _turns(n: int) -> list[dict[str, Any]]:
    return [Turn.of(f"run-{i:016x}", f"question {i}: {QUESTIONS[i % len(QUESTIONS)]}",
                    json.dumps({"action": "final_answer", "answer": f"answer {i}: " + "a reasonably short reply. " * 3}),
                    f"answer {i}").to_dict() for i in range(n)]


# -- 1. the planner's reads per turn -----------------------------------------------------------------
async def load_cost(settings: Settings, rounds: int) -> dict[int, dict[str, float]]:
    prefix = f"benchsess{uuid.uuid4().hex[:6]}."
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    out: dict[int, dict[str, float]] = {}
    try:
        for n in SIZES:
            session = f"s{n}"
            turns = _turns(n)
            tokens = sum(t["tokens"] for t in turns)
            await pool.execute("INSERT INTO sessions (prefix, session_id, turns, tokens) VALUES ($1, $2, $3::jsonb, $4)",
                               prefix, session, json.dumps(turns), tokens)
            times = []
            for _ in range(rounds):
                t0 = time.perf_counter()
                row = await store.load(pool, prefix, session)
                await store.active_turns(pool, prefix, session)
                assert row is not None
                Transcript.from_rows(row.epoch, row.turns, row.dropped).fit(DEFAULT_TOKEN_BUDGET)
                times.append((time.perf_counter() - t0) * 1000)
            out[n] = {"p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95), "tokens": tokens}
    finally:
        await pool.execute("DELETE FROM sessions WHERE prefix = $1", prefix)
        await pool.close()
    return out


# -- 2. through the pipeline -------------------------------------------------------------------------
async def pipeline_cost(settings: Settings, turns: int) -> dict[str, float]:
    async with Pipeline.start(isolated(settings, f"benchsess{uuid.uuid4().hex[:6]}."),
                              WorkerOptions(backend="scripted")) as pipe:
        client = pipe.client
        session = f"bench-{uuid.uuid4().hex[:6]}"
        plain: list[float] = []
        turned: list[float] = []
        for i in range(turns + 2):  # the first of each warms its path up
            for samples, kwargs in ((plain, {}), (turned, {"session": session})):
                t0 = time.perf_counter()
                run_id = await client.submit(f"[[answer:reply {i}]] {QUESTIONS[i % len(QUESTIONS)]}", tools=[],
                                             prefetch=False, **kwargs)
                result = await client.wait(run_id, timeout=30)
                assert result.ok, result
                if i >= 2:
                    samples.append((time.perf_counter() - t0) * 1000)
        details = await client.sessions.show(session)
        assert details is not None
    return {"runs_p50_ms": statistics.median(plain), "turns_p50_ms": statistics.median(turned),
            "added_p50_ms": statistics.median(turned) - statistics.median(plain),
            "transcript_turns": len(details.row.turns), "transcript_tokens": details.row.tokens}


# -- 3. the CPU model's TTFT per turn ----------------------------------------------------------------
TOOLS = [ToolInfo("calculator", "Evaluate an arithmetic expression.",
                  {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}),
         ToolInfo("weather", "The weather forecast for a city, today and the next two days.",
                  {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})]


async def kv_reuse(threads: int | None, rounds: int) -> dict[str, Any]:
    from agentstream.services.inference.backends.base import ChatMessage, Delta, Final, GenerationRequest
    from agentstream.services.inference.backends.llamacpp import LlamaCppBackend

    class NoReuse(LlamaCppBackend):
        """The same engine, with the prompt cache off: every request processes its whole prompt."""

        def _body(self, request: GenerationRequest) -> dict[str, Any]:
            return {**super()._body(request), "cache_prompt": False}

    now = datetime.now(UTC)

    async def step(backend: LlamaCppBackend, messages: list[Any], schema: str) -> tuple[str, float, Final]:
        request = GenerationRequest(request_id=uuid.uuid4().hex, max_tokens=48, response_schema=json.loads(schema),
                                    messages=tuple(ChatMessage(role=m.role, content=m.content, name=m.name)
                                                   for m in messages))
        t0, ttft = time.perf_counter(), None
        async for item in backend.generate(request):
            if isinstance(item, Delta) and ttft is None:
                ttft = (time.perf_counter() - t0) * 1000
            elif isinstance(item, Final):
                return item.text, ttft if ttft is not None else item.ttft_ms, item
        raise RuntimeError("no final record")

    async def conversation(backend: LlamaCppBackend, given: list[tuple[list[Any], str]] | None
                           ) -> tuple[list[tuple[list[Any], str]], list[Final], list[float]]:
        """The five turns' first requests (built from the model's replies, or ``given``), in order."""
        await backend.start()
        try:
            warm = machine.start(_task("warm-up", "Hello."), TOOLS, now)
            await step(backend, [warm.messages[0], warm.messages[1]], warm.response_schema or "{}")
            asked, finals, ttfts = [], [], []
            history = Transcript()
            for i, question in enumerate(QUESTIONS):
                if given is None:
                    state = machine.begin(machine.start(_task(f"turn{i}", question), TOOLS, now, queued=True),
                                          history, now)
                    messages, schema = list(state.messages), state.response_schema or "{}"
                else:
                    messages, schema = given[i]
                text, ttft, final = await step(backend, messages, schema)
                asked.append((messages, schema))
                finals.append(final)
                ttfts.append(ttft)
                history = history.after(Turn.of(f"turn{i}", question, text, text))
            return asked, finals, ttfts
        finally:
            await backend.close()

    asked, finals, first = await conversation(LlamaCppBackend(slots=1, threads=threads), None)
    reused, fresh = [first], []
    for r in range(rounds):
        if r:
            reused.append((await conversation(LlamaCppBackend(slots=1, threads=threads), asked))[2])
        fresh.append((await conversation(NoReuse(slots=1, threads=threads, prompt_cache_mib=0), asked))[2])
    return {"rounds": rounds, "turns": [
        {"turn": i + 1, "prompt_tokens": finals[i].prompt_tokens, "cached_prompt_tokens": finals[i].cached_prompt_tokens,
         "reused_ttft_ms": statistics.median(r[i] for r in reused),
         "fresh_ttft_ms": statistics.median(f[i] for f in fresh)} for i in range(len(QUESTIONS))]}


def _task(run_id: str, text: str) -> TaskSubmitted:
    return TaskSubmitted.build(run_id=run_id, step=f"{run_id}:task", service="bench", task=text,
                               tools=[t.name for t in TOOLS],
                               max_steps=4, prefetch=False, session="bench")


async def main(args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings.load()
    out: dict[str, Any] = {"load": {str(n): v for n, v in (await load_cost(settings, args.rounds)).items()}}
    out["pipeline"] = await pipeline_cost(replace(settings), args.turns)
    if args.kv:
        out["kv"] = await kv_reuse(args.threads, args.kv_rounds)
    return out


def report(out: dict[str, Any]) -> None:
    print("transcript load per turn (PostgreSQL: the session's row and its turns going, then the budget cut)")
    for n, v in out["load"].items():
        print(f"  {n:>3} turns ({v['tokens']:>4} tokens)   p50 {v['p50_ms']:.2f} ms   p95 {v['p95_ms']:.2f} ms")
    p = out["pipeline"]
    print(f"through the pipeline (scripted model), submit to outcome: runs p50 {p['runs_p50_ms']:.1f} ms, "
          f"turns p50 {p['turns_p50_ms']:.1f} ms, added {p['added_p50_ms']:+.1f} ms "
          f"(transcript: {p['transcript_turns']} turns, {p['transcript_tokens']} tokens)")
    if "kv" in out:
        print(f"5-turn conversation on the CPU model, each turn's first request: TTFT, median of "
              f"{out['kv']['rounds']} conversations")
        for t in out["kv"]["turns"]:
            print(f"  turn {t['turn']}: {t['prompt_tokens']:>4} prompt tokens ({t['cached_prompt_tokens']:>4} cached)   "
                  f"reused {t['reused_ttft_ms']:7.1f} ms   fresh {t['fresh_ttft_ms']:7.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40, help="turns (and runs) through the pipeline")
    parser.add_argument("--rounds", type=int, default=LOAD_ROUNDS, help="reads per transcript size")
    parser.add_argument("--kv", action="store_true", help="also the CPU model's TTFT per turn (loads SmolLM2)")
    parser.add_argument("--kv-rounds", type=int, default=3, help="conversations per mode (the medians are shown)")
    parser.add_argument("--threads", type=int, default=None, help="llama.cpp threads (default: its own)")
    parser.add_argument("--json", action="store_true", help="last line: one JSON object")
    arguments = parser.parse_args()
    result = asyncio.run(main(arguments))
    report(result)
    if arguments.json:
        print(json.dumps(result))
