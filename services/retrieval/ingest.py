"""Ingestion: text and markdown files → overlapping chunks → embeddings → ``documents``.

    stats = await ingest(pool, embedder, ["docs/"], collection="handbook")

Why it is built this way:

- **chunks follow the text's own boundaries** — paragraphs, then sentences, then words only as a last
  resort — so a passage handed to the model reads as prose; markdown is first cut into sections at its
  headings, a heading always travels with its section, and every chunk of a section starts with the
  section's heading, so a chunk says what it is about even when it comes from the middle of a section;
- **chunks overlap** by up to ``overlap`` characters (whole trailing sentences where they fit), so a fact
  that straddles a boundary is whole in one of the two chunks;
- **the default size (700 characters, about 170 tokens) fits the model's 256-token window** with room
  to spare (all-MiniLM-L6-v2 was trained on 128-token inputs and cuts at 256), and shorter inputs embed
  faster;
- **de-duplication by content** — the key is the sha256 of the normalised chunk (Unicode NFC, runs of
  whitespace collapsed), unique per collection: a chunk already stored is skipped *before* it is
  embedded, so re-ingesting a corpus costs one query, and a concurrent ingest of the same text is
  absorbed by ``ON CONFLICT DO NOTHING``; a stored chunk that has no embedding yet (written before
  embeddings existed) gets one;
- **binary COPY** of each batch (the pgvector codec encodes the vectors) into a temporary table, then one
  ``INSERT … SELECT … ON CONFLICT`` into ``documents``: COPY is the fast path, and the staging table is
  what makes it idempotent. The next batch is embedded while the previous one is written.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

from agentstream.services.retrieval.embeddings import Embedder
from agentstream.streams.core.errors import IngestError

CHUNK_CHARS = 700
OVERLAP = 100
BATCH = 64  # chunks embedded and written per round trip
TEXT_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".mdx", ".rst"}
MARKDOWN_SUFFIXES = {".md", ".markdown", ".mdx"}

_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SENTENCE_END = re.compile(r"(?:(?<=[.!?…])|(?<=[.!?…][\"')\]]))\s+")
_SPACES = re.compile(r"\s+")

#: ``progress(stage, done, total)``: stage "files" (read and chunked) or "chunks" (embedded and written).
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Chunk:
    """One passage of one file, ready to embed."""

    source: str
    index: int
    text: str
    heading: str | None = None

    @cached_property
    def content_hash(self) -> str:
        return content_hash(self.text)

    @property
    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"chars": len(self.text)}
        if self.heading:
            meta["heading"] = self.heading
        return meta


@dataclass
class IngestStats:
    files: int = 0
    chunks: int = 0
    inserted: int = 0
    #: chunks not written: already in the collection, or repeated within this ingest
    skipped_duplicates: int = 0
    #: stored chunks that had no embedding and got one
    embedded_existing: int = 0
    skipped_files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    embed_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def normalise(text: str) -> str:
    """What makes two chunks "the same": Unicode NFC and whitespace runs collapsed, nothing else
    (case and punctuation can carry meaning)."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", text)).strip()


def content_hash(text: str) -> str:
    return hashlib.sha256(normalise(text).encode()).hexdigest()


# --- chunking -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Unit:
    """A piece that is never split further at this level, and the separator that goes before it."""

    text: str
    sep: str


def _paragraphs(body: str) -> list[str]:
    """Blank-line separated blocks; a fenced code block is one block even with blank lines inside."""
    blocks: list[str] = []
    current: list[str] = []
    fenced = False
    for line in body.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        if not fenced and not line.strip():
            if current:
                blocks.append("\n".join(current).strip("\n"))
                current = []
            continue
        current.append(line.rstrip())
    if current:
        blocks.append("\n".join(current).strip("\n"))
    return [b for b in blocks if b.strip()]


def _split_long(text: str, limit: int, overlap: int = 0) -> list[_Unit]:
    """A block over ``limit``: into sentences (code: into lines), and any piece still too long into
    word-aligned slices short enough to leave room for the overlap (a word longer than that is cut)."""
    is_code = bool(_FENCE.match(text)) or text.startswith("    ")
    pieces = text.splitlines() if is_code else [s for s in _SENTENCE_END.split(text) if s.strip()]
    sep = "\n" if is_code else " "
    units: list[_Unit] = []
    for piece in pieces:
        piece = piece if is_code else piece.strip()
        if len(piece) <= limit:
            units.append(_Unit(piece, sep))
            continue
        width = max(limit - overlap, limit // 2)
        line = ""
        for word in piece.split(" "):
            while len(word) > width:
                if line:
                    units.append(_Unit(line, sep))
                    line = ""
                units.append(_Unit(word[:width], sep))
                word = word[width:]
            if line and len(line) + 1 + len(word) > width:
                units.append(_Unit(line, sep))
                line = word
            else:
                line = f"{line} {word}" if line else word
        if line:
            units.append(_Unit(line, sep))
    return units


def _units(body: str, limit: int, overlap: int = 0) -> list[_Unit]:
    units: list[_Unit] = []
    for block in _paragraphs(body):
        if len(block) <= limit:
            units.append(_Unit(block, "\n\n"))
        else:
            split = _split_long(block, limit, overlap)
            units.append(_Unit(split[0].text, "\n\n"))  # a new paragraph starts with a paragraph break
            units.extend(split[1:])
    return units


def _join(units: Sequence[_Unit]) -> str:
    return "".join((u.sep if i else "") + u.text for i, u in enumerate(units))


def _size(units: Sequence[_Unit]) -> int:
    return len(_join(units))


def _tail(units: Sequence[_Unit], overlap: int) -> list[_Unit]:
    """The end of a chunk to repeat at the start of the next, at most ``overlap`` characters: whole
    trailing units if any fit, else the last unit's trailing sentences, else its trailing words."""
    if overlap <= 0 or not units:
        return []
    tail: list[_Unit] = []
    for unit in reversed(units):
        if _size([unit, *tail]) > overlap:
            break
        tail.insert(0, unit)
    if tail:
        return tail
    last = units[-1].text
    for pieces, sep in (([s for s in _SENTENCE_END.split(last) if s.strip()], " "), (last.split(" "), " ")):
        kept: list[str] = []
        for piece in reversed(pieces[1:]):
            if len(sep.join([piece.strip(), *kept])) > overlap:
                break
            kept.insert(0, piece.strip())
        if kept:
            return [_Unit(sep.join(kept), " ")]
    return []


def _pack(units: list[_Unit], budget: int, overlap: int) -> list[str]:
    """Greedy packing of units into chunks of at most ``budget`` characters, with overlap."""
    chunks: list[str] = []
    current: list[_Unit] = []
    fresh = 0  # units in ``current`` that are not overlap from the previous chunk
    for unit in units:
        if fresh and _size([*current, unit]) > budget:
            chunks.append(_join(current))
            room = budget - len(unit.text) - len(unit.sep)  # the overlap must leave room for the unit
            current = _tail(current, min(overlap, room))
            fresh = 0
        current.append(unit)
        fresh += 1
    if fresh:
        chunks.append(_join(current))
    return chunks


def _sections(text: str, markdown: bool) -> list[tuple[str | None, str | None, str]]:
    """(heading path, heading line, body) per section; plain text is one section."""
    if not markdown:
        return [(None, None, text)]
    sections: list[tuple[str | None, str | None, str]] = []
    path: list[tuple[int, str]] = []
    heading_line: str | None = None
    body: list[str] = []
    fenced = False

    def close() -> None:
        if heading_line is not None or any(line.strip() for line in body):
            sections.append((" > ".join(t for _, t in path) or None, heading_line, "\n".join(body)))

    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        match = None if fenced else _HEADING.match(line)
        if match is None:
            body.append(line)
            continue
        close()
        level, title = len(match.group(1)), match.group(2).strip()
        path = [(lv, t) for lv, t in path if lv < level] + [(level, title)]
        heading_line, body = line.strip(), []
    close()
    return sections


def chunk_text(text: str, *, chunk_chars: int = CHUNK_CHARS, overlap: int = OVERLAP,
               markdown: bool = False) -> list[tuple[str, str | None]]:
    """``(chunk, heading path)`` pairs covering ``text`` in order.

    Sections (markdown) are packed whole while they fit, so short sections share a chunk; a longer one
    is split on its own, each part starting with its heading line. No chunk is longer than
    ``chunk_chars`` unless one heading line plus one word already is."""
    if chunk_chars < 50:
        raise ValueError("chunk_chars must be at least 50")
    overlap = max(0, min(overlap, chunk_chars // 2))
    out: list[tuple[str, str | None]] = []
    pending: list[str] = []
    pending_heading: str | None = None

    def flush() -> None:
        nonlocal pending, pending_heading
        if pending:
            out.append(("\n\n".join(pending), pending_heading))
        pending, pending_heading = [], None

    for path, heading, body in _sections(text, markdown):
        whole = "\n\n".join(p for p in [heading, *_paragraphs(body)] if p)
        if not whole.strip():
            continue
        if len(whole) <= chunk_chars:
            if pending and len("\n\n".join([*pending, whole])) > chunk_chars:
                flush()
            if not pending:
                pending_heading = path
            pending.append(whole)
            continue
        flush()
        prefix = f"{heading}\n\n" if heading else ""
        budget = max(chunk_chars - len(prefix), 40)
        for part in _pack(_units(body, budget, overlap), budget, overlap):
            out.append((prefix + part, path))
        if heading and not _paragraphs(body):
            out.append((heading, path))
    flush()
    return out


def chunk_file(path: Path, source: str, *, chunk_chars: int = CHUNK_CHARS,
               overlap: int = OVERLAP) -> list[Chunk] | None:
    """The file's chunks, or None when it is not text (NUL bytes, or not UTF-8)."""
    raw = path.read_bytes()
    if b"\x00" in raw:
        return None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    pairs = chunk_text(text, chunk_chars=chunk_chars, overlap=overlap,
                       markdown=path.suffix.lower() in MARKDOWN_SUFFIXES)
    return [Chunk(source, i, body, heading) for i, (body, heading) in enumerate(pairs)]


def discover(paths: Iterable[str | Path]) -> list[tuple[Path, str]]:
    """(file, source name) for every file named, and every text/markdown file under every directory
    named (recursively, hidden files and directories skipped, in sorted order). A missing path raises
    FileNotFoundError before anything is written."""
    found: dict[Path, str] = {}
    for given in paths:
        root = Path(given)
        if root.is_file():
            found.setdefault(root.resolve(), str(given))
        elif root.is_dir():
            for path in sorted(root.rglob("*")):
                rel = path.relative_to(root)
                if (path.is_file() and path.suffix.lower() in TEXT_SUFFIXES
                        and not any(part.startswith(".") for part in rel.parts)):
                    found.setdefault(path.resolve(), str(root / rel))
        else:
            raise FileNotFoundError(f"no such file or directory: {given}")
    return [(path, source) for path, source in found.items()]


# --- writing ------------------------------------------------------------------------------------------

_STAGING = """CREATE TEMP TABLE ingest_staging (
    source text, chunk_index integer, content text, content_hash text, metadata jsonb,
    embedding vector(384)) ON COMMIT DROP"""
_COLUMNS = ["source", "chunk_index", "content", "content_hash", "metadata", "embedding"]
_MERGE = """INSERT INTO documents (collection, source, chunk_index, content, content_hash, metadata, embedding)
    SELECT $1, source, chunk_index, content, content_hash, metadata, embedding FROM ingest_staging
    ON CONFLICT (collection, content_hash) DO UPDATE SET embedding = EXCLUDED.embedding
        WHERE documents.embedding IS NULL
    RETURNING (xmax = 0) AS inserted"""


async def _write(pool: asyncpg.Pool, collection: str, chunks: Sequence[Chunk],
                 vectors: np.ndarray) -> tuple[int, int]:
    """COPY one batch into a staging table and merge it; (inserted, embeddings filled in)."""
    records = [(c.source, c.index, c.text, c.content_hash, json.dumps(c.metadata), vectors[i])
               for i, c in enumerate(chunks)]
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(_STAGING)
        await conn.copy_records_to_table("ingest_staging", records=records, columns=_COLUMNS)
        rows = await conn.fetch(_MERGE, collection)
    inserted = sum(1 for r in rows if r["inserted"])
    return inserted, len(rows) - inserted


async def _existing(pool: asyncpg.Pool, collection: str, hashes: list[str]) -> set[str]:
    """Hashes already stored *with* an embedding (those need nothing)."""
    rows = await pool.fetch(
        """SELECT content_hash FROM documents
           WHERE collection = $1 AND content_hash = ANY($2::text[]) AND embedding IS NOT NULL""",
        collection, hashes)
    return {r["content_hash"] for r in rows}


async def ingest(pool: asyncpg.Pool, embedder: Embedder, paths: Iterable[str | Path], *,
                 collection: str = "default", chunk_chars: int = CHUNK_CHARS, overlap: int = OVERLAP,
                 batch: int = BATCH, progress: Progress | None = None) -> IngestStats:
    """Chunk, de-duplicate, embed and store ``paths``; see the module docstring. ``pool``'s connections
    need the pgvector codec (``agentstream.streams.store.db.create_pool``)."""
    started = time.perf_counter()
    stats = IngestStats()
    files = discover(paths)
    report = progress or (lambda stage, done, total: None)
    unique: dict[str, Chunk] = {}
    report("files", 0, len(files))
    for n, (path, source) in enumerate(files, 1):
        chunks = await asyncio.to_thread(chunk_file, path, source, chunk_chars=chunk_chars, overlap=overlap)
        if chunks is None:
            stats.skipped_files.append(source)
        else:
            stats.files += 1
            stats.chunks += len(chunks)
            for chunk in chunks:
                unique.setdefault(chunk.content_hash, chunk)
        report("files", n, len(files))
    stored = await _existing(pool, collection, list(unique)) if unique else set()
    todo = [c for h, c in unique.items() if h not in stored]
    stats.skipped_duplicates = stats.chunks - len(todo)
    report("chunks", 0, len(todo))

    async def embed(part: list[Chunk]) -> np.ndarray:
        t0 = time.perf_counter()
        vectors = await embedder.embed([c.text for c in part])
        stats.embed_seconds += time.perf_counter() - t0
        return vectors

    batches = [todo[i : i + batch] for i in range(0, len(todo), batch)]
    done = 0
    next_vectors = asyncio.create_task(embed(batches[0])) if batches else None
    for i, part in enumerate(batches):
        assert next_vectors is not None
        vectors = await next_vectors
        next_vectors = asyncio.create_task(embed(batches[i + 1])) if i + 1 < len(batches) else None
        try:
            inserted, filled = await _write(pool, collection, part, vectors)
        except BaseException:
            if next_vectors is not None:
                next_vectors.cancel()
            raise
        stats.inserted += inserted
        stats.embedded_existing += filled
        stats.skipped_duplicates += len(part) - inserted - filled  # lost a race to a concurrent ingest
        done += len(part)
        report("chunks", done, len(todo))
    stats.seconds = time.perf_counter() - started
    return stats


# --- the CLI's entry point ------------------------------------------------------------------------------


def run_ingest_cli(paths: Sequence[str], collection: str = "default", console: Any = None, *,
                   chunk_chars: int = CHUNK_CHARS, overlap: int = OVERLAP,
                   database_url: str | None = None) -> IngestStats:
    """``agentstream ingest PATH… [--collection NAME]``: migrate, load the model, ingest with a rich
    progress bar on ``console``, print a summary line there. Blocking; returns the stats. Errors a user
    can fix (a missing path, the model's packages missing) are AgentStreamErrors."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agentstream.streams.config.settings import Settings
    from agentstream.streams.store import db, migrations

    console = console or Console()
    url = database_url or Settings.load().database_url
    try:
        discover(paths)  # a missing path fails here, before the model loads
    except FileNotFoundError as exc:
        raise IngestError(str(exc)) from exc

    async def go(bar: Progress) -> IngestStats:
        tasks = {"files": bar.add_task("reading files", total=None),
                 "chunks": bar.add_task("embedding chunks", total=None, start=False)}

        def on_progress(stage: str, done: int, total: int) -> None:
            bar.start_task(tasks[stage])
            bar.update(tasks[stage], completed=done, total=total)

        await migrations.migrate(url)
        embedder = Embedder()
        load = asyncio.create_task(embedder.load())  # loads while the files are read
        pool = await db.create_pool(url, min_size=1, max_size=2)
        try:
            await load
            return await ingest(pool, embedder, paths, collection=collection, chunk_chars=chunk_chars,
                                overlap=overlap, progress=on_progress)
        finally:
            await pool.close()

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        stats = asyncio.run(go(bar))
    rate = stats.inserted / stats.seconds if stats.seconds else 0.0
    console.print(f"collection [bold]{collection}[/bold]: {stats.files} files, {stats.chunks} chunks, "
                  f"{stats.inserted} inserted, {stats.skipped_duplicates} already there or repeated"
                  + (f", {stats.embedded_existing} embeddings filled in" if stats.embedded_existing else "")
                  + (f", {len(stats.skipped_files)} not text ({', '.join(stats.skipped_files[:3])})"
                     if stats.skipped_files else "")
                  + f" in {stats.seconds:.1f} s ({rate:.0f} chunks/s)")
    return stats
