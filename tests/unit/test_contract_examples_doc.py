"""docs/contract.md shows the examples' code; examples/contract/ holds the same code as files that CI builds and
runs (tests/integration/test_contract_examples.py). A fenced block right after a marker line
``<!-- example: PATH -->`` must equal the file PATH, byte for byte, so that the code a reader copies is the code
that ran; every example source must be shown that way, and the dependency versions the doc names must be the
ones the build files pin.

After changing an example, copy it into the doc with ``python -m tests.unit.test_contract_examples_doc --write``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "contract.md"
EXAMPLES = ROOT / "examples" / "contract"
#: The example sources the doc must show (build files and lock files are not shown).
SOURCES = ("java/src/main/java/SubmitTask.java", "go/main.go", "node/submit.js", "node/submit_registry.js",
           "python/submit.py", "python/submit_registry.py")
#: A marker, then the fenced block it names: group 1 the path, 2 the fence's language, 3 the code.
BLOCK = re.compile(r"^<!-- example: (\S+) -->\n```(\w*)\n(.*?)^```$", re.M | re.S)


def _blocks(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in BLOCK.finditer(text):
        assert match.group(1) not in found, f"{match.group(1)} is shown twice"
        found[match.group(1)] = match.group(3)
    return found


def test_every_example_is_shown_as_it_is():
    blocks = _blocks(DOC.read_text())
    assert set(blocks) == {f"examples/contract/{s}" for s in SOURCES}, sorted(blocks)
    for path, code in blocks.items():
        assert code == (ROOT / path).read_text(), (
            f"docs/contract.md's block for {path} differs from the file: "
            "python -m tests.unit.test_contract_examples_doc --write")


def test_a_marker_is_always_followed_by_its_block():
    """A marker whose block was edited out of shape (no fence right after it) would escape the check above."""
    text = DOC.read_text()
    markers = re.findall(r"^<!-- example: (\S+) -->$", text, re.M)
    assert len(markers) == len(BLOCK.findall(text)) == len(SOURCES)


def _pins() -> dict[str, str]:
    """Each direct dependency of the examples and the version its build file pins."""
    pins: dict[str, str] = {}
    pom = (EXAMPLES / "java" / "pom.xml").read_text()
    for group, artifact, version in re.findall(
            r"<dependency><groupId>([^<]+)</groupId><artifactId>([^<]+)</artifactId><version>([^<]+)</version>", pom):
        pins[f"{group}:{artifact}"] = version
    gomod = (EXAMPLES / "go" / "go.mod").read_text()
    for module, version in re.findall(r"^\t(\S+) (v\S+)$", gomod.split("\n)", 1)[0], re.M):
        pins[module] = version
    for name, version in json.loads((EXAMPLES / "node" / "package.json").read_text())["dependencies"].items():
        pins[name] = version
    for line in (EXAMPLES / "python" / "requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.split("[")[0]] = version
    return pins


def test_the_doc_names_the_pinned_versions():
    pins = _pins()
    assert {"org.apache.kafka:kafka-clients", "github.com/twmb/franz-go", "kafkajs", "confluent-kafka"} <= set(pins)
    text = DOC.read_text()
    for name, version in pins.items():
        assert f"{name}@{version}" in text or f"{name}:{version}" in text or f"{name}=={version}" in text, (
            f"docs/contract.md does not name {name} {version} as the example pins it")


def test_contract_schemas_writes_what_the_examples_read(tmp_path):
    """`agentstream contract schemas --out DIR`, for a team without the repository: the .avsc files the examples
    read from schemas/ (and the older versions), byte for byte."""
    from typer.testing import CliRunner

    from agentstream.cli.contract import app

    done = CliRunner().invoke(app, ["schemas", "--out", str(tmp_path / "avsc")])
    assert done.exit_code == 0, done.output
    wanted = sorted(p.relative_to(ROOT / "schemas") for p in (ROOT / "schemas").rglob("*.avsc"))
    assert sorted(p.relative_to(tmp_path / "avsc") for p in (tmp_path / "avsc").rglob("*.avsc")) == wanted
    assert Path("history/TaskSubmitted.v0.avsc") in wanted
    for path in wanted:
        assert (tmp_path / "avsc" / path).read_bytes() == (ROOT / "schemas" / path).read_bytes()


def write() -> None:
    """Copy each example file into its block of the doc."""
    text = DOC.read_text()

    def block(match: re.Match[str]) -> str:
        return f"<!-- example: {match.group(1)} -->\n```{match.group(2)}\n{(ROOT / match.group(1)).read_text()}```"

    DOC.write_text(BLOCK.sub(block, text))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
