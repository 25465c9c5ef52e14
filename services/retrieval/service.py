"""The retrieval service: RetrievalRequested in, RetrievalCompleted (top-k passages) out.

Search is hybrid (services/retrieval/search.py): PostgreSQL full-text over ``documents`` (any of the
query's words) and pgvector nearest neighbours of the query's embedding (all-MiniLM-L6-v2 on the CPU,
services/retrieval/embeddings.py), fused by reciprocal rank fusion; a passage's score is its fused score.
Concurrent requests share embedding batches. Call ``await service.start()`` before the service joins its
group, so the model is loaded before the first request arrives.

Bad input — an empty query, k out of range, an unknown collection — gets an error result, not a crash.
If the embedding model cannot be loaded (its packages missing), ``start()`` raises; a service that was
not started degrades to full-text search and logs why, once.
"""

from __future__ import annotations

import logging
import re
import time

import asyncpg

from agentstream.services.retrieval.embeddings import Embedder
from agentstream.services.retrieval.search import DEFAULT_EF_SEARCH, Hit, hybrid_search
from agentstream.streams.core.errors import EmbeddingModelUnavailable
from agentstream.streams.core.events import Event, Passage, RetrievalCompleted, RetrievalRequested
from agentstream.streams.runtime.publisher import Runtime
from agentstream.streams.runtime.records import Context, ServiceConfig
from agentstream.streams.runtime.runner import ServiceRunner

log = logging.getLogger(__name__)
SERVICE = "retrieval"
MAX_K = 50
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


class RetrievalService:
    def __init__(self, runtime: Runtime, pool: asyncpg.Pool, embedder: Embedder | None = None, *,
                 ef_search: int = DEFAULT_EF_SEARCH) -> None:
        """``embedder``: defaults to one over the process's shared ONNX encoder (loaded by ``start``)."""
        self.runtime = runtime
        self.pool = pool
        self.embedder: Embedder | None = embedder if embedder is not None else Embedder()
        self.ef_search = ef_search
        self._degraded_logged = False
        metrics = getattr(runtime, "metrics", None)  # None: no metrics (or a stand-in runtime in tests)
        self._step_seconds = metrics.step_seconds.labels("retrieval") if metrics else None

    async def start(self) -> None:
        """Load the embedding model (in a worker thread; idempotent). Raises
        :class:`EmbeddingModelUnavailable` when its packages are missing."""
        if self.embedder is not None:
            await self.embedder.load()

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
        duration_s = time.perf_counter() - started
        await ctx.emit(self.runtime.topics.retrieval_results, RetrievalCompleted.build(
            run_id=event.run_id, step=event.step_id, service=SERVICE, attempt=event.attempt,
            parent_step_id=event.parent_step_id, passages=passages, error=error,
            duration_ms=duration_s * 1000))
        if self._step_seconds is not None:
            self._step_seconds.observe(duration_s)
        span = getattr(ctx, "span", None)
        if span is not None:
            span.set_attributes({"agentstream.passages": len(passages),
                                     "agentstream.collection": event.collection, "agentstream.k": event.k})
            if error is not None:
                span.set_attribute("agentstream.error", error)

    @staticmethod
    def _problem(event: RetrievalRequested) -> str | None:
        if not _WORD.findall(event.query):
            return "the query is empty"
        if not 1 <= event.k <= MAX_K:
            return f"k must be between 1 and {MAX_K} (got {event.k})"
        return None

    async def search(self, query: str, k: int, collection: str) -> list[Passage]:
        hits = await self.hybrid(query, k, collection)
        return [Passage(id=str(h.id), text=h.content, score=h.score, source=h.source) for h in hits]

    async def hybrid(self, query: str, k: int, collection: str) -> list[Hit]:
        """The hits with each leg's rank (for debugging and tests)."""
        try:
            hits = await hybrid_search(self.pool, query, k=k, collection=collection, embedder=self.embedder,
                                       ef_search=self.ef_search)
        except EmbeddingModelUnavailable as exc:
            if not self._degraded_logged:
                log.error("retrieval: no embedding model (%s); serving full-text search only", exc)
                self._degraded_logged = True
            self.embedder = None
            hits = await hybrid_search(self.pool, query, k=k, collection=collection, embedder=None)
        if log.isEnabledFor(logging.DEBUG):
            for h in hits:
                log.debug("retrieval %r: id=%s fused=%.4f text_rank=%s vector_rank=%s", query, h.id, h.score,
                          h.text_rank, h.vector_rank)
        return hits
