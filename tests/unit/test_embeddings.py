"""The embedding model gives all-MiniLM-L6-v2's vectors, and the Embedder batches concurrent callers."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from agentstream.services.retrieval.embeddings import DIM, Embedder, OnnxEncoder, cosine, shared_encoder
from agentstream.streams.core.errors import EmbeddingModelUnavailable

# Cosine similarities that sentence-transformers' all-MiniLM-L6-v2 (fp32) gives for these pairs; the first
# three are the SBERT quickstart's published matrix, all six were reproduced here from the original weights.
# The int8 ONNX model lands within 0.006 of every one of them.
KNOWN = [
    ("The weather is lovely today.", "It's so sunny outside!", 0.6660),
    ("The weather is lovely today.", "He drove to the stadium.", 0.1046),
    ("It's so sunny outside!", "He drove to the stadium.", 0.1411),
    ("The new movie is awesome", "The new movie is so great", 0.8939),
    ("The new movie is awesome", "The dog plays in the garden", 0.0543),
    ("A man is playing guitar", "A woman watches TV", -0.0327),
]


@pytest.fixture(scope="module")
def encoder() -> OnnxEncoder:
    enc = shared_encoder()
    enc.load()
    return enc


def test_vectors_match_the_reference_model(encoder):
    texts = sorted({t for a, b, _ in KNOWN for t in (a, b)})
    vectors = dict(zip(texts, encoder.encode(texts), strict=True))
    for a, b, expected in KNOWN:
        assert cosine(vectors[a], vectors[b]) == pytest.approx(expected, abs=0.01), (a, b)


def test_similar_sentences_score_far_above_unrelated_ones(encoder):
    query, close, far = encoder.encode(["How do I reset my password?",
                                        "Steps to recover access to a forgotten account login.",
                                        "The stadium was full for the football final."])
    assert cosine(query, close) > 0.5 and cosine(query, far) < 0.15


def test_shape_norm_and_batch_independence(encoder):
    texts = ["short", "a somewhat longer sentence about event streams on Kafka", "x " * 400]  # last > 256 tokens
    together = encoder.encode(texts)
    assert together.shape == (3, DIM) and together.dtype == np.float32
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    alone = np.stack([encoder.encode([t])[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-4)  # padding in a batch does not change a text's vector
    assert encoder.encode([]).shape == (0, DIM)


class SlowEncoder:
    """Records each forward pass; returns a vector that identifies the text, after ``delay`` seconds."""

    dim = 4

    def __init__(self, delay: float = 0.05) -> None:
        self.delay = delay
        self.passes: list[list[str]] = []
        self.threads: set[int] = set()
        self.fail_next = False

    def load(self) -> None:
        return None

    def encode(self, texts):
        self.passes.append(list(texts))
        self.threads.add(threading.get_ident())
        time.sleep(self.delay)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("boom")
        return np.array([[float(t.split("-")[1]), 0, 0, 1] for t in texts], dtype=np.float32)


async def test_concurrent_calls_are_gathered_into_batches():
    encoder = SlowEncoder()
    embedder = Embedder(encoder, max_batch=8)
    await embedder.load()
    first = asyncio.create_task(embedder.embed(["t-0"]))
    await asyncio.sleep(0.01)  # the first batch (one call) is running now
    rest = [asyncio.create_task(embedder.embed([f"t-{i}"])) for i in range(1, 21)]
    results = await asyncio.gather(first, *rest)
    for i, vectors in enumerate(results):  # every caller got its own row
        assert vectors.shape == (1, 4) and vectors[0, 0] == i
    # 1 pass for the first call, then the 20 that arrived meanwhile in passes of at most 8.
    assert [len(p) for p in encoder.passes] == [1, 8, 8, 4]
    assert embedder.batches == [1, 8, 8, 4]
    assert threading.get_ident() not in encoder.threads  # computed off the event loop


async def test_a_call_larger_than_the_batch_runs_whole_and_multi_text_calls_stay_together():
    encoder = SlowEncoder(delay=0.01)
    embedder = Embedder(encoder, max_batch=4)
    big, small = await asyncio.gather(embedder.embed([f"t-{i}" for i in range(10)]),
                                      embedder.embed(["t-42", "t-43"]))
    assert big[:, 0].tolist() == list(range(10)) and small[:, 0].tolist() == [42, 43]
    assert [len(p) for p in encoder.passes] == [10, 2]


async def test_the_event_loop_stays_free_while_a_batch_runs():
    embedder = Embedder(SlowEncoder(delay=0.3))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await embedder.embed(["t-1"])
    task.cancel()
    assert ticks >= 15


async def test_errors_reach_the_callers_of_that_batch_and_cancelled_callers_are_skipped():
    encoder = SlowEncoder()
    embedder = Embedder(encoder)
    await embedder.load()
    encoder.fail_next = True
    with pytest.raises(RuntimeError, match="boom"):
        await embedder.embed(["t-1"])
    assert (await embedder.embed(["t-2"]))[0, 0] == 2  # the next batch works

    running = asyncio.create_task(embedder.embed(["t-3"]))
    await asyncio.sleep(0.01)
    cancelled = asyncio.create_task(embedder.embed(["t-4"]))
    kept = asyncio.create_task(embedder.embed(["t-5"]))
    await asyncio.sleep(0)
    cancelled.cancel()
    assert (await running)[0, 0] == 3 and (await kept)[0, 0] == 5
    assert ["t-4"] not in encoder.passes and ["t-5"] in encoder.passes
    assert (await embedder.embed([])).shape == (0, 4)


async def test_real_model_concurrent_queries_share_forward_passes(encoder):
    embedder = Embedder(encoder, max_batch=32)
    texts = [f"question number {i} about retrieval" for i in range(16)]
    alone = encoder.encode(texts)
    before = encoder.forward_passes
    results = await asyncio.gather(*(embedder.embed([t]) for t in texts))
    assert encoder.forward_passes - before <= 2  # sixteen calls, not sixteen passes
    assert np.allclose(np.concatenate(results), alone, atol=1e-4)


def test_a_missing_or_wrong_model_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTSTREAM_EMBEDDING_MODEL", str(tmp_path / "nope.onnx"))
    with pytest.raises(EmbeddingModelUnavailable, match=r"no embedding model found .*pip install"):
        OnnxEncoder().load()
    wrong = tmp_path / "model.onnx"
    wrong.write_bytes(b"not a model")
    monkeypatch.setenv("AGENTSTREAM_EMBEDDING_MODEL", str(wrong))
    with pytest.raises(EmbeddingModelUnavailable, match="not the pinned file"):
        OnnxEncoder().load()
