-- pgvector: vector columns and HNSW indexes (retrieval).
CREATE EXTENSION IF NOT EXISTS vector;
