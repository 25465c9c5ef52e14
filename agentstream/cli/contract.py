"""``agentstream contract …``: the contract for other languages (agentstream/ops/asyncapi.py)."""

from __future__ import annotations

import sys

import typer

from agentstream.cli.common import err

app = typer.Typer(help="The contract for other languages: topics, keys, events, headers (docs/contract.md).",
                  no_args_is_help=True)


@app.command("asyncapi")
def contract_asyncapi(
    out: str = typer.Option(None, "--out", help="Write the document to this file instead of printing it."),
) -> None:
    """The AsyncAPI 3.0 document of agentstream's topics, built from the code (JSON; docs/asyncapi.json is
    the committed copy: regenerate it with --out docs/asyncapi.json after changing topics or schemas)."""
    from pathlib import Path

    from agentstream.ops.asyncapi import build_document, render

    text = render(build_document())
    if out is None:
        sys.stdout.write(text)
        return
    Path(out).write_text(text)
    err.print(f"wrote {out}")


@app.command("schemas")
def contract_schemas(
    out: str = typer.Option(..., "--out", help="The folder to write them to (created if missing)."),
) -> None:
    """Write the Avro schemas of the events (.avsc; older versions under history/) to a folder: what a producer
    in another language writes and reads with (docs/contract.md, "Getting the schemas"), from this
    installation, so they match the release it runs."""
    import shutil
    from pathlib import Path

    from agentstream.streams.core import resources

    source, target = resources.schemas_dir(), Path(out)
    (target / "history").mkdir(parents=True, exist_ok=True)
    files = sorted(source.glob("*.avsc")) + sorted((source / "history").glob("*.avsc"))
    for path in files:
        shutil.copyfile(path, target / path.relative_to(source))
    err.print(f"wrote {len(files)} schemas to {target}")
