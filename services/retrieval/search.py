"""Hybrid search over ``documents``: PostgreSQL full-text and pgvector (HNSW, cosine), fused by RRF.

Why two legs: full text finds exact and rare words (an error code, a name) that an embedding blurs;
the vector leg finds passages that say the same thing in other words. Why reciprocal rank fusion
(Cormack et al., 2009; k = 60): the legs' scores (``ts_rank_cd`` and cosine distance) are not on one
scale, but their ranks are, and RRF needs no tuning. Each leg fetches ``CANDIDATES_PER_K`` * k
candidates, so a passage ranked modestly by both legs can still win. A document without an embedding
is still found by the full-text leg; with no embedder, search is full-text only.

The vector leg runs with ``SET LOCAL hnsw.ef_search`` (the size of the HNSW candidate list: recall
against latency, measured by bench/perf/retrieval.py) and pgvector's iterative scan, so a filter on the
collection cannot leave it with fewer rows than asked for.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import numpy as np
from asyncpg.pool import PoolConnectionProxy

from agentstream.services.retrieval.embeddings import Embedder

RRF_K = 60
#: The smallest ef_search with recall@10 >= 0.95 both on the bulk of a 100k-row index and for real
#: questions over a small real-text collection inside it (bench/perf/retrieval.py, m=16, ef_construction=64,
#: 2 cores, two runs): recall@10 0.82-0.83 / 0.951-0.955 / 0.988-0.991 overall and 0.70-0.75 /
#: 0.87-0.89 / 0.94-0.98 for the real questions at 40 / 100 / 200; p99 4.6-5.4 / 8.2-9.6 / 13.1-13.2 ms.
DEFAULT_EF_SEARCH = 200
CANDIDATES_PER_K = 4
_WORD = re.compile(r"[^\W_]+", re.UNICODE)

_TEXT_SQL = """SELECT id, ts_rank_cd(tsv, q) AS score
    FROM documents, to_tsquery('english', $1) AS q
    WHERE collection = $2 AND tsv @@ q
    ORDER BY score DESC, id LIMIT $3"""
# Iterative scan returns rows in roughly (not exactly) ascending distance: re-sort the few it returns.
_VECTOR_SQL = """WITH nearest AS MATERIALIZED (
        SELECT id, embedding <=> $1 AS distance FROM documents
        WHERE collection = $2 AND embedding IS NOT NULL
        ORDER BY embedding <=> $1 LIMIT $3)
    SELECT id, distance FROM nearest ORDER BY distance, id"""


@dataclass(frozen=True)
class Hit:
    """One result: the fused score, and where each leg ranked it (1-based; None: not in its list)."""

    id: int
    content: str
    source: str | None
    score: float
    text_rank: int | None = None
    vector_rank: int | None = None
    text_score: float | None = None
    distance: float | None = None


def words(query: str) -> list[str]:
    return list(dict.fromkeys(w.lower() for w in _WORD.findall(query)))


def any_word_tsquery(query: str) -> str:
    """``a | b | c``: a passage matching any of the query's words qualifies, more matches rank higher
    (the retrieval service's behaviour before embeddings, kept for the text leg). Words are letters and
    digits only, so the string is always a valid tsquery."""
    return " | ".join(words(query))


def rrf(rankings: Sequence[Sequence[int]], *, k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: score(d) = sum over rankings of 1 / (k + rank of d), rank 1-based.

    Returns (id, score), best first. Ties (common: one leg's first against the other's first) go to
    the better single rank, then to the earlier ranking — hybrid search passes the text leg first,
    because an exact word match is the more specific evidence — then to the lower id."""
    scores: dict[int, float] = {}
    best: dict[int, tuple[int, int]] = {}
    for leg, ranking in enumerate(rankings):
        for rank, doc in enumerate(ranking, 1):
            scores[doc] = scores.get(doc, 0.0) + 1.0 / (k + rank)
            best[doc] = min(best.get(doc, (rank, leg)), (rank, leg))
    return sorted(scores.items(), key=lambda item: (-item[1], best[item[0]], item[0]))


async def text_leg(pool: asyncpg.Pool, query: str, collection: str, limit: int) -> list[tuple[int, float]]:
    """(id, ts_rank_cd), best first."""
    terms = any_word_tsquery(query)
    if not terms:
        return []
    rows = await pool.fetch(_TEXT_SQL, terms, collection, limit)
    return [(r["id"], float(r["score"])) for r in rows]


async def vector_leg(db: asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy, vector: np.ndarray,
                     collection: str, limit: int, *,
                     ef_search: int = DEFAULT_EF_SEARCH) -> list[tuple[int, float]]:
    """(id, cosine distance), nearest first, through the HNSW index (on a small table the planner may
    rightly prefer an exact scan). ``db``: a pool, or a connection (with the pgvector codec), pooled or not."""
    if isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn:
            return await vector_leg(conn, vector, collection, limit, ef_search=ef_search)
    async with db.transaction():
        # SET LOCAL ends with the transaction: pooled connections keep no session state (streams/store/db.py).
        # ef_search below the limit would cap the rows an index scan can return.
        await db.execute(f"SET LOCAL hnsw.ef_search = {max(int(ef_search), int(limit))}")
        await db.execute("SET LOCAL hnsw.iterative_scan = relaxed_order")
        rows = await db.fetch(_VECTOR_SQL, np.asarray(vector, dtype=np.float32), collection, limit)
    return [(r["id"], float(r["distance"])) for r in rows]


async def hybrid_search(pool: asyncpg.Pool, query: str, *, k: int, collection: str = "default",
                        embedder: Embedder | None = None, ef_search: int = DEFAULT_EF_SEARCH,
                        candidates: int | None = None) -> list[Hit]:
    """The top ``k`` passages for ``query`` in ``collection``, best first (see the module docstring)."""
    limit = candidates or CANDIDATES_PER_K * k

    async def semantic() -> list[tuple[int, float]]:
        if embedder is None:
            return []
        vector = (await embedder.embed([query]))[0]
        return await vector_leg(pool, vector, collection, limit, ef_search=ef_search)

    text, vector = await asyncio.gather(text_leg(pool, query, collection, limit), semantic())
    fused = rrf([[i for i, _ in text], [i for i, _ in vector]])[:k]
    if not fused:
        return []
    ids = [i for i, _ in fused]
    rows = {r["id"]: r for r in await pool.fetch(
        "SELECT id, content, source FROM documents WHERE id = ANY($1::bigint[])", ids)}
    text_at = {doc: (rank, score) for rank, (doc, score) in enumerate(text, 1)}
    vector_at = {doc: (rank, dist) for rank, (doc, dist) in enumerate(vector, 1)}
    hits = []
    for doc, score in fused:
        row = rows.get(doc)
        if row is None:  # deleted between the legs and now
            continue
        t, v = text_at.get(doc), vector_at.get(doc)
        hits.append(Hit(id=doc, content=row["content"], source=row["source"], score=score,
                        text_rank=t[0] if t else None, vector_rank=v[0] if v else None,
                        text_score=t[1] if t else None, distance=v[1] if v else None))
    return hits
