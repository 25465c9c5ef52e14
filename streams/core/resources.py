"""Files that ship inside the package: the event schemas, the SQL migrations, the broker's and the
database's configuration. They are found with ``importlib.resources``, so an installed wheel finds them
exactly as a source checkout does (in the checkout, ``agentstream/schemas`` and ``agentstream/infra``
link to the repository's ``schemas/`` and ``infra/``)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def package_path(*parts: str) -> Path:
    """The path of a file or directory shipped in the ``agentstream`` package.

    Callers read directories (``glob``) and hand paths to other programs (the broker's config to Java),
    so a real path is returned; agentstream is never imported from a zip file.
    """
    found = files("agentstream").joinpath(*parts)
    if not isinstance(found, Path):  # a zip import or another loader without files on disk
        raise RuntimeError(f"agentstream must be installed as files on disk to read {'/'.join(parts)}")
    return found


def schemas_dir() -> Path:
    """The ``*.avsc`` files of the current event schemas (older versions under ``history/``)."""
    return package_path("schemas")


def infra_dir() -> Path:
    """The broker's Maven pom and config templates, PostgreSQL's config and the SQL migrations."""
    return package_path("infra")


def migrations_dir() -> Path:
    return infra_dir() / "postgres" / "migrations"
