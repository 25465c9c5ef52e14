"""Chunking: boundaries follow paragraphs, sentences and markdown sections; chunks overlap; hashes
ignore whitespace only."""

from __future__ import annotations

import itertools
import re

import pytest

from agentstream.services.retrieval.ingest import chunk_file, chunk_text, content_hash, discover, normalise

SENTENCES = [f"Sentence {i} says something about topic {i % 7} in a plain way." for i in range(60)]


def _plain(paragraph_len: int = 5) -> str:
    paras = [" ".join(SENTENCES[i : i + paragraph_len]) for i in range(0, len(SENTENCES), paragraph_len)]
    return "\n\n".join(paras)


def test_short_text_is_one_chunk():
    assert chunk_text("One line.\n\n\nAnother   paragraph.") == [("One line.\n\nAnother   paragraph.", None)]
    assert chunk_text("   \n\n  ") == []


def test_chunks_respect_size_and_end_at_sentence_boundaries():
    chunks = [c for c, _ in chunk_text(_plain(), chunk_chars=400, overlap=0)]
    assert len(chunks) > 5
    assert all(len(c) <= 400 for c in chunks)
    for c in chunks:  # every chunk is whole sentences
        assert c.startswith("Sentence ") and c.endswith("way."), c
    assert sum(len(re.findall(r"Sentence \d+ ", c)) for c in chunks) == len(SENTENCES)  # no overlap: each once


def test_paragraphs_are_kept_whole_when_they_fit():
    chunks = [c for c, _ in chunk_text(_plain(paragraph_len=3), chunk_chars=500, overlap=0)]
    for c in chunks:
        for para in c.split("\n\n"):
            assert len(re.findall(r"Sentence \d+ ", para)) == 3  # never a paragraph cut in two


def test_consecutive_chunks_overlap():
    chunks = [c for c, _ in chunk_text(_plain(), chunk_chars=400, overlap=120)]
    sentence = re.compile(r"Sentence \d+ [^.]*\.")
    for before, after in itertools.pairwise(chunks):
        b, a = sentence.findall(before), sentence.findall(after)
        shared = [s for s in a if s in b]
        assert shared and shared == b[-len(shared):] == a[: len(shared)], (before[-80:], after[:80])
        assert len(" ".join(shared)) <= 120  # whole trailing sentences, within the overlap
    every = {s for c in chunks for s in re.findall(r"Sentence \d+ [^.]*\.", c)}
    assert every == set(SENTENCES)  # and nothing is lost


def test_overlap_falls_back_to_words_when_a_sentence_is_too_long():
    text = " ".join(f"word{i}" for i in range(400))  # one sentence, no punctuation
    chunks = [c for c, _ in chunk_text(text, chunk_chars=200, overlap=40)]
    assert all(len(c) <= 200 for c in chunks)
    for before, after in itertools.pairwise(chunks):
        assert before.split()[-1] in after.split()[:8]
    assert chunks[-1].endswith("word399")


def test_a_word_longer_than_a_chunk_is_cut():
    chunks = [c for c, _ in chunk_text("x" * 250 + " tail.", chunk_chars=100, overlap=0)]
    assert all(len(c) <= 100 for c in chunks) and "".join(chunks).replace(" ", "") == "x" * 250 + "tail."


MARKDOWN = """# Handbook

Welcome to the handbook.

## Deploying

{deploy}

```bash
make deploy

# not a heading: inside a code fence
```

## Rollback

Run the rollback job.

### Data

Restore the snapshot.
"""


def test_markdown_headings_stay_with_their_sections():
    deploy = " ".join(f"Deploy step {i} is done by the release captain." for i in range(20))
    chunks = chunk_text(MARKDOWN.format(deploy=deploy), chunk_chars=300, overlap=60, markdown=True)
    texts = [c for c, _ in chunks]
    deploy_chunks = [(c, h) for c, h in chunks if "Deploy step" in c]
    assert len(deploy_chunks) >= 3
    for c, heading in deploy_chunks:  # every part of a long section starts with its heading
        assert c.startswith("## Deploying\n\n") and heading == "Handbook > Deploying"
    code = next(c for c in texts if "make deploy" in c)
    assert "# not a heading: inside a code fence" in code and "```bash" in code
    # Short sections are packed together, each with its heading, and no chunk ends on a bare heading.
    tail = texts[-1]
    assert "## Rollback\n\nRun the rollback job." in tail and "### Data\n\nRestore the snapshot." in tail
    assert [h for c, h in chunks if c is tail] == ["Handbook > Rollback"]
    for c in texts:
        assert not re.search(r"^#+ [^\n]*\Z", c), c
    assert texts[0].startswith("# Handbook\n\nWelcome to the handbook.")


def test_markdown_heading_path_resets_at_a_higher_level():
    text = "# A\n\n" + "a. " * 200 + "\n\n## B\n\n" + "b. " * 200 + "\n\n# C\n\n" + "c. " * 200
    paths = {h for _, h in chunk_text(text, chunk_chars=300, markdown=True)}
    assert paths == {"A", "A > B", "C"}


def test_hash_ignores_whitespace_but_not_case():
    assert normalise("  a\n\tb   c ") == "a b c"
    assert content_hash("a  b\nc") == content_hash("a b c") != content_hash("A b c")
    assert content_hash("cafe\u0301") == content_hash("caf\u00e9")  # NFC


def test_files_are_discovered_recursively_and_binary_files_refused(tmp_path):
    (tmp_path / "a.md").write_text("# T\n\nHello.")
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "sub" / "deeper" / "b.txt").write_text("World.")
    (tmp_path / "sub" / "image.png").write_bytes(b"\x89PNG\x00")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "c.md").write_text("hidden")
    found = discover([tmp_path])
    assert sorted(source for _, source in found) == [str(tmp_path / "a.md"), str(tmp_path / "sub/deeper/b.txt")]
    assert discover([tmp_path / "a.md", tmp_path]) == discover([tmp_path / "a.md"]) + found[1:]
    with pytest.raises(FileNotFoundError, match="nope"):
        discover([tmp_path / "nope"])
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"abc\x00def")
    assert chunk_file(binary, "bin.txt") is None
    chunks = chunk_file(tmp_path / "a.md", "a.md")
    assert [(c.index, c.text, c.heading, c.source) for c in chunks] == [(0, "# T\n\nHello.", "T", "a.md")]
