"""Generate the Grafana dashboards (grafanalib) into dashboards/generated/*.json.

The JSON is committed so Grafana provisioning needs no Python; the output is deterministic
(sorted keys, fixed ids), and --check tells whether the committed files are stale.

    python dashboards/build.py            # rewrite dashboards/generated/*.json
    python dashboards/build.py --check    # exit 1 if regenerating would change them
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DASHBOARDS_DIR = Path(__file__).resolve().parent
REPO_ROOT = DASHBOARDS_DIR.parent
GENERATED_DIR = DASHBOARDS_DIR / "generated"
sys.path[:0] = [str(DASHBOARDS_DIR), str(REPO_ROOT)]

from grafanalib._gen import DashboardEncoder  # noqa: E402

from engine_dashboard import engine_dashboard  # noqa: E402
from panels import grafana_json  # noqa: E402
from thresholds import DEFAULT_THRESHOLDS  # noqa: E402
# Stage order: docs/architecture.md, "The nine server stages", "The proxy's stages" and
# "Inside the engine".
from tracer.record.stages import PROXY_STAGE_LABELS, SERVER_STAGES  # noqa: E402
from ttft_attribution import ttft_attribution_dashboard  # noqa: E402


def render_dashboards() -> dict[str, str]:
    """File name -> JSON text, exactly as committed."""
    dashboards = {
        "ttft-attribution.json": ttft_attribution_dashboard(
            SERVER_STAGES, DEFAULT_THRESHOLDS.ttft_p95_s, proxy_stages=PROXY_STAGE_LABELS,
            buffered_share=DEFAULT_THRESHOLDS.buffered_share),
        "engine.json": engine_dashboard(),
    }
    # Encoded once to plain JSON, then normalised to Grafana's schema (panels.grafana_json).
    plain = {name: json.loads(json.dumps(d.to_json_data(), cls=DashboardEncoder))
             for name, d in dashboards.items()}
    return {name: json.dumps(grafana_json(board), sort_keys=True, indent=2,
                             ensure_ascii=False) + "\n"
            for name, board in plain.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate dashboards/generated/*.json")
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when a committed file differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render_dashboards().items():
        path = GENERATED_DIR / name
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
            continue
        GENERATED_DIR.mkdir(exist_ok=True)
        path.write_text(text)
    if stale:
        print("stale, run python dashboards/build.py:", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
