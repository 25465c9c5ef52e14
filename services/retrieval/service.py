"""The retrieval service: RetrievalRequested in, RetrievalCompleted (top-k passages) out.

Search is PostgreSQL full-text over ``documents`` (any of the query's words, ranked by ``ts_rank_cd``).
Bad input — an empty query, k out of range, an unknown collection — gets an error result, not a crash.
"""

from __future__ import annotations

import re
import time

import asyncpg

from streams.events import Event, Passage, RetrievalCompleted, RetrievalRequested
from streams.runtime import Context, Runtime, ServiceConfig, ServiceRunner

SERVICE = "retrieval"
MAX_K = 50
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


class RetrievalService:
    def __init__(self, runtime: Runtime, pool: asyncpg.Pool) -> None:
        self.runtime = runtime
        self.pool = pool

    def service(self, *, concurrency: int = 16, **overrides) -> ServiceRunner:
        topics = self.runtime.topics
        config = ServiceConfig(name=SERVICE, topics=[topics.retrieval_requests], group_id=topics.group(SERVICE),
                               concurrency=concurrency, **overrides)
        return ServiceRunner(self.runtime, config, self.handle)

    async def handle(self, event: Event, ctx: Context) -> None:
        if not isinstance(event, RetrievalRequested):
            raise TypeError(f"the retrieval service does not handle {type(event).__name__}")
        started = time.perf_counter()
        passages: list[Passage] = []
        error = self._problem(event)
        if error is None:
            if not await self.pool.fetchval("SELECT EXISTS (SELECT 1 FROM documents WHERE collection = $1)",
                                            event.collection):
                error = f"unknown collection {event.collection!r}"
            else:
                passages = await self.search(event.query, event.k, event.collection)
        await ctx.emit(self.runtime.topics.retrieval_results, RetrievalCompleted.build(
            run_id=event.run_id, step=event.step_id, service=SERVICE, attempt=event.attempt,
            parent_step_id=event.parent_step_id, passages=passages, error=error,
            duration_ms=(time.perf_counter() - started) * 1000))

    @staticmethod
    def _problem(event: RetrievalRequested) -> str | None:
        if not _WORD.findall(event.query):
            return "the query is empty"
        if not 1 <= event.k <= MAX_K:
            return f"k must be between 1 and {MAX_K} (got {event.k})"
        return None

    async def search(self, query: str, k: int, collection: str) -> list[Passage]:
        terms = " | ".join(dict.fromkeys(w.lower() for w in _WORD.findall(query)))
        rows = await self.pool.fetch(
            """SELECT id, content, source, ts_rank_cd(tsv, q) AS score
               FROM documents, to_tsquery('english', $1) AS q
               WHERE collection = $2 AND tsv @@ q
               ORDER BY score DESC, id LIMIT $3""",
            terms, collection, k)
        return [Passage(id=str(r["id"]), text=r["content"], score=float(r["score"]), source=r["source"])
                for r in rows]
