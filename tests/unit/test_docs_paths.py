"""The docs name files that exist: a file moved or split without its mentions following is caught here
(the examples of a user's own files aside)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md", REPO / "bench" / "README.md"]
#: Paths in the docs that are a user's, not ours.
EXAMPLES = {"mypkg/tools.py", "tests/test_my_tools.py", "infra/postgres/migrations/NNNN_name.sql"}
PATH = re.compile(r"(?<![\w./-])((?:streams|services|agentstream|bench|tests|infra|docs|schemas)/[\w/.-]*?\.(?:py|sql|sh|md|json|avsc))\b")


def test_every_repository_path_the_docs_name_exists() -> None:
    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                 check=True).stdout.split())
    missing = [f"{doc.relative_to(REPO)}:{number}: {path}"
               for doc in DOCS for number, line in enumerate(doc.read_text().splitlines(), 1)
               for path in PATH.findall(line)
               if path not in EXAMPLES and path not in tracked and not (REPO / path).exists()]
    assert missing == []
