"""Every docs/*.md page with a contents list (links to its own headings before its first
`##` section) lists every one of its `##` sections, each link reaching a heading of the
page; a page of four or more `##` sections has such a list.

Anchors follow GitHub's rules for headings: the rendered text (code spans and links reduced
to their text), lower-cased, punctuation other than `-` and `_` dropped, each space a `-`,
and a repeated anchor suffixed `-1`, `-2`, ... in the order the headings come."""
from __future__ import annotations

import pathlib
import re

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
MIN_SECTIONS_FOR_A_LIST = 4

HEADING = re.compile(r"^(?P<level>#{1,6})[ \t]+(?P<text>.+?)[ \t]*#*[ \t]*$")
FENCE = re.compile(r"^[ \t]*(```|~~~)")
LOCAL_LINK = re.compile(r"\]\(#(?P<anchor>[^)\s]+)\)")


def slug(text: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)     # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)                         # inline HTML tags
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)                        # \w keeps letters, digits, _
    return text.replace(" ", "-")


def headings(text: str) -> list[tuple[int, str, str]]:
    """(level, text, anchor) of every heading outside code fences, anchors made unique."""
    found, seen, fenced = [], {}, False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m["text"])
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.append((len(m["level"]), m["text"], base if n == 0 else f"{base}-{n}"))
    return found


def preamble(text: str) -> str:
    """The page before its first `##` heading (outside code fences)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("## "):
            break
        lines.append(line)
    return "\n".join(lines)


def test_slugs_follow_githubs_rules():
    assert slug("llama.cpp server") == "llamacpp-server"
    assert slug("Engines' metric names") == "engines-metric-names"
    assert slug("On an H200 (`bench/gpu_check.py`)") == "on-an-h200-benchgpu_checkpy"
    assert slug("In front of vLLM, SGLang, llama.cpp or any OpenAI-compatible server") == \
        "in-front-of-vllm-sglang-llamacpp-or-any-openai-compatible-server"
    assert slug("first_printable_late") == "first_printable_late"
    assert slug("A [linked](x.md) heading") == "a-linked-heading"
    assert [a for _, _, a in headings("## Same\n## Same\n```\n## not one\n```\n## Same\n")] == \
        ["same", "same-1", "same-2"]


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_the_contents_list_links_every_section(page):
    text = page.read_text()
    found = headings(text)
    sections = [anchor for level, _, anchor in found if level == 2]
    listed = LOCAL_LINK.findall(preamble(text))
    if not listed:
        assert len(sections) < MIN_SECTIONS_FOR_A_LIST, \
            f"{page.name}: {len(sections)} sections and no contents list"
        return
    anchors = {anchor for _, _, anchor in found}
    assert [a for a in listed if a not in anchors] == [], f"{page.name}: links to no heading"
    assert [s for s in sections if s not in listed] == [], f"{page.name}: not in the contents"
