"""docs/runbook.md has one section per TTFT cause, saying what tracer/record/causes.py says, and
every alert's runbook_url lands on one of its headings."""
from __future__ import annotations

import re

import pytest

from dashboards_support import DASHBOARDS, PROMETHEUS_DIR, REPO, load_module, load_yaml
from tracer.record.causes import CAUSE_NAMES, CAUSES, ENGINES

RUNBOOK = REPO / "docs" / "runbook.md"
# LLMTTFTP95High's runbook_url: the top cause's anchor, read with a query, or a fixed one.
_TOP_CAUSE_ANCHOR = re.compile(
    r'\{\{ with query .+ \}\}\{\{ \. \| first \| label "cause" \}\}'
    r'\{\{ else \}\}(?P<fallback>[\w-]+)\{\{ end \}\}')
_TABLE_ROW = re.compile(r"^\| (?P<engine>[^|]+?) \| (?P<change>[^|]+?) \|$", re.MULTILINE)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than - and _ dropped,
    spaces as hyphens.

    >>> github_anchor("When no cause stands out"), github_anchor("prefix_cache_miss")
    ('when-no-cause-stands-out', 'prefix_cache_miss')
    """
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def sections(markdown: str) -> dict[str, str]:
    """`## heading` -> the text up to the next `##` heading (outside fenced code)."""
    out, heading, in_fence = {}, None, False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_fence = not in_fence
        if not in_fence and line.startswith("## "):
            heading = line[3:].strip()
            assert heading not in out, f"two sections named {heading!r}"
            out[heading] = ""
        elif heading is not None:
            out[heading] += line + "\n"
    return out


@pytest.fixture(scope="module")
def runbook() -> dict[str, str]:
    return sections(RUNBOOK.read_text())


def anchors() -> set[str]:
    headings = [m.group(1) for m in re.finditer(r"^#{1,6} (.+)$", RUNBOOK.read_text(), re.M)]
    found = [github_anchor(h) for h in headings]
    assert len(found) == len(set(found)), "two headings with one anchor"
    return set(found)


def alert_rules() -> list[dict]:
    return [r for g in load_yaml(PROMETHEUS_DIR / "rules" / "alerts.yml")["groups"]
            for r in g["rules"] if "alert" in r]


def test_every_cause_has_a_section_named_after_it(runbook):
    assert [c for c in CAUSE_NAMES if c not in runbook] == []


@pytest.mark.parametrize("cause", CAUSES, ids=lambda c: c.name)
def test_each_section_says_what_causes_py_says(cause, runbook):
    text = runbook[cause.name]
    assert cause.title.lower() in text.lower()       # the UI sentence starts with the title
    for key in cause.evidence:
        assert f"`{key}`" in text, key
    # The action table: the same change for each engine, word for word.
    table = {m["engine"]: m["change"] for m in _TABLE_ROW.finditer(text)
             if m["engine"] in ENGINES}
    assert table == cause.actions


def test_every_alert_links_a_runbook_heading():
    base = load_module(DASHBOARDS / "thresholds.py", "ttftscope_thresholds").DEFAULT_THRESHOLDS
    known = anchors()
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"].strip()
        page, _, anchor = url.partition("#")
        assert page == base.runbook_url, rule["alert"]
        if top := _TOP_CAUSE_ANCHOR.fullmatch(anchor):
            # Any cause the query returns has a section (above); the fallback must too.
            assert top["fallback"] in known, rule["alert"]
        else:
            assert anchor in known, (rule["alert"], anchor)


def test_the_runbook_urls_the_unit_tests_render_land_on_headings():
    """What promtool renders for the alerts, queried anchors included."""
    rendered = [alert["exp_annotations"]["runbook_url"]
                for path in sorted((PROMETHEUS_DIR / "tests").glob("*.yml"))
                for test in load_yaml(path)["tests"]
                for case in test.get("alert_rule_test", [])
                for alert in case.get("exp_alerts") or []
                if "runbook_url" in alert.get("exp_annotations", {})]
    assert len(rendered) >= len(alert_rules())
    known = anchors()
    assert {url.partition("#")[2] for url in rendered} <= known


def test_every_actionable_cause_has_an_alert_of_its_own():
    linked = {r["annotations"]["runbook_url"].partition("#")[2] for r in alert_rules()}
    assert [c.name for c in CAUSES if c.actionable and c.name not in linked] == []


def test_the_runbooks_own_links_land_on_its_headings():
    links = re.findall(r"\]\(#([^)]+)\)", RUNBOOK.read_text())
    assert links and set(links) <= anchors()
