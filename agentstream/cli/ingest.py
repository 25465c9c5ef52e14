"""``agentstream ingest``: files into the retrieval corpus (agentstream/services/retrieval/ingest.py)."""

from __future__ import annotations

import json

import typer

from agentstream.cli.common import console, err


def ingest(
    paths: list[str] = typer.Argument(..., help="Files or directories (text and markdown, recursively)."),
    collection: str = typer.Option("default", help="Collection to add the chunks to."),
    chunk_chars: int = typer.Option(700, help="Most characters per chunk."),
    overlap: int = typer.Option(100, help="Characters repeated between consecutive chunks."),
    as_json: bool = typer.Option(False, "--json", help="Print the stats as one JSON object."),
) -> None:
    """Chunk, embed and store text/markdown files for retrieval (re-ingesting adds only what is new)."""
    from agentstream.services.retrieval.ingest import run_ingest_cli
    from agentstream.streams.config.identity import Identity
    from agentstream.streams.config.settings import Settings

    # The corpus is written with the schema owner's login (docs/security.md).
    database_url = Settings.load(identity=Identity(database_login="postgres")).database_url
    stats = run_ingest_cli(paths, collection, err if as_json else console, chunk_chars=chunk_chars,
                           overlap=overlap, database_url=database_url)
    if as_json:
        print(json.dumps(stats.as_dict()))
