"""The public API is documented, and its reference builds: every name in ``agentstream.__all__`` has a
docstring of its own (a constant: a ``#:`` comment or a string after its assignment), and the pdoc
reference (docs/api.py, ``make docs-api``) shows each name with the start of its documentation."""

from __future__ import annotations

import html
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

import agentstream

ROOT = Path(__file__).resolve().parents[2]


def _docs_api() -> ModuleType:
    """docs/api.py, the reference's builder (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("agentstream_docs_api", ROOT / "docs" / "api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


api = _docs_api()


def _words(text: str, n: int = 6) -> str:
    """The first ``n`` words of some reST, without its markup, as the rendered page shows them."""
    return " ".join(re.sub(r"[`*]", "", text).split()[:n])


def test_every_public_name_has_its_own_docstring() -> None:
    missing = api.undocumented()
    assert not missing, (f"public names without documentation: {missing}. A class or function needs a "
                         "docstring of its own; a constant a `#:` comment above its assignment, where it is "
                         "defined (agentstream._EXPORTS says where)")


def test_the_reference_builds_and_shows_every_public_name(tmp_path: Path) -> None:
    try:
        import pdoc  # noqa: F401
    except ModuleNotFoundError:
        pytest.fail("pdoc is not installed: it comes with the dev extra (`make venv`, or pip install 'pdoc>=16')")
    page = api.build(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"agentstream.html", "index.html", "search.js"}
    source = page.read_text()
    absent = [name for name in agentstream.__all__ if f'id="{name}"' not in source]
    assert not absent, f"public names the reference does not show: {absent}"
    # the rendered docstrings only (each object's source is on the page too, its docstring in it)
    rendered = "".join(re.findall(r'<div class="docstring">(.*?)</div>', source, re.S))
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", rendered)).split())
    undocumented = [name for name in agentstream.__all__ if _words(api.public_doc(name)) not in text]
    assert not undocumented, f"public names shown without their documentation: {undocumented}"
