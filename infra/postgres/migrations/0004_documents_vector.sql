-- The vector leg of hybrid retrieval (services/retrieval/search.py): an HNSW index over the chunk
-- embeddings (all-MiniLM-L6-v2, 384-d, L2-normalised), compared by cosine distance (`<=>`).
-- m = 16, ef_construction = 64 are pgvector's defaults, written out so a change is a new migration;
-- bench/retrieval.py measures recall@10 and latency against exact search for this index.
-- Rows without an embedding are not indexed; they are still found by the full-text leg.
-- Building it on an empty table is instant; on 100k existing rows it takes 2-3 minutes on 2 cores.
CREATE INDEX IF NOT EXISTS documents_embedding_hnsw
    ON documents USING hnsw (embedding vector_cosine_ops) WITH (m = 16, ef_construction = 64);
