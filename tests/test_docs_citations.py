"""Every citation of the docs in the tree points at a heading that exists.

Code and docs cite a section as `docs/<file>.md, "<heading>"` (the comma is optional), the
heading spelled exactly as the markdown `#` line has it, and the citation may wrap across a
comment's line break. A renamed or deleted heading leaves such a citation pointing nowhere;
this test finds it, whatever kind of file holds it."""
from __future__ import annotations

import pathlib
import re

THIS_FILE = pathlib.Path(__file__).resolve()
REPO = THIS_FILE.parents[1]
# Not the project's text: installed packages, built or cached output, git's own files.
SKIPPED_DIRS = frozenset((".venv", "node_modules", ".git", "__pycache__", ".hypothesis",
                          ".pytest_cache", ".test-output", "ttftscope.egg-info"))
SUFFIXES = frozenset((".py", ".js", ".mjs", ".ts", ".md", ".yml", ".yaml", ".toml", ".c",
                      ".h", ".html", ".sh", ".conf", ".alloy", ".in"))
NAMES = frozenset(("Makefile", "Dockerfile", ".importlinter", "run"))
# The quotes may be escaped (a citation inside a Python or JS string). Inside the heading, a
# line break with the next line's indentation and comment marker (#, //, *) stands for one
# space: that is how a wrapped comment or docstring continues a sentence.
_LINE_BREAK = r"\n[ \t]*(?:#+|//|\*)?[ \t]*"
CITATION = re.compile(r'docs/(?P<file>[\w.-]+\.md),?[ \t]*(?:' + _LINE_BREAK + r')?\\?"'
                      r'(?P<heading>(?:[^"\\\n]|' + _LINE_BREAK + r')+?)\\?"')
DOC_FILE = re.compile(r"\bdocs/(?P<file>[\w.-]+\.md)\b")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<text>.+?)[ \t]*#*[ \t]*$")
FENCE = re.compile(r"^[ \t]*(```|~~~)")


def headings(markdown: str) -> set[str]:
    """The `#` headings of a markdown text, outside fenced code blocks.

    >>> sorted(headings("# A\\n```\\n# not one\\n```\\n## B ##\\ntext"))
    ['A', 'B']
    """
    found, in_fence = set(), False
    for line in markdown.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (m := HEADING.match(line)):
            found.add(m.group("text"))
    return found


def citations(text: str) -> list[tuple[int, str, str]]:
    """(line, docs file, heading) of each citation in `text`.

    >>> citations('x  # see docs/reference.md, "The in-band\\n    # timing line".')
    [(1, 'reference.md', 'The in-band timing line')]
    >>> citations('msg = "(docs/architecture.md, \\\\"Through the engine\\\\")"')
    [(1, 'architecture.md', 'Through the engine')]
    """
    return [(text.count("\n", 0, m.start()) + 1, m.group("file"),
             re.sub(_LINE_BREAK, " ", m.group("heading")))
            for m in CITATION.finditer(text)]


def project_files() -> list[pathlib.Path]:
    """The files that may cite the docs; not this one, whose examples cite missing headings."""
    files = []
    for path in REPO.rglob("*"):
        parts = path.relative_to(REPO).parts
        if SKIPPED_DIRS.intersection(parts) or not path.is_file() or path == THIS_FILE:
            continue
        if path.suffix in SUFFIXES or path.name in NAMES:
            files.append(path)
    return sorted(files)


def _read(path: pathlib.Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def test_every_docs_citation_names_an_existing_heading():
    docs = {p.name: headings(_read(p)) for p in (REPO / "docs").glob("*.md")}
    found, broken = 0, []
    for path in project_files():
        text = _read(path)
        where = path.relative_to(REPO)
        for line, doc, heading in citations(text):
            found += 1
            if doc not in docs:
                broken.append(f'{where}:{line}: docs/{doc} does not exist')
            elif heading not in docs[doc]:
                broken.append(f'{where}:{line}: docs/{doc} has no heading "{heading}"')
        for m in DOC_FILE.finditer(text):
            if m.group("file") not in docs:
                line = text.count("\n", 0, m.start()) + 1
                broken.append(f"{where}:{line}: docs/{m.group('file')} does not exist")
    # A pattern that matched nothing would pass vacuously; the tree has ~80 citations.
    assert found > 20, f"only {found} citations found: is the pattern still right?"
    assert not broken, "citations pointing nowhere:\n" + "\n".join(broken)


def test_a_broken_citation_is_reported(tmp_path):
    """The same functions judge a citation of a heading that is not there."""
    doc_headings = headings("# Title\n## Real heading\n")
    cited = citations('# docs/reference.md, "Real heading"; docs/reference.md, "Gone"\n')
    assert [(doc, h, h in doc_headings) for _, doc, h in cited] == [
        ("reference.md", "Real heading", True), ("reference.md", "Gone", False)]
