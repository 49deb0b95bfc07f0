"""Generates the Grafana dashboards and keeps the Helm chart's copies in sync.

deploy/grafana/*.json are the dashboards users import or provision, written from the panel lists
in :mod:`dev.tools.grafana.boards` (the builders: :mod:`dev.tools.grafana.panels`; built into
Grafana's JSON model with grafana-foundation-sdk by :mod:`dev.tools.grafana.render`); edit there,
run ``python dev/tools/dashboards.py``, commit both.

helm/kdelay/files/ holds byte-identical copies of them and of deploy/prometheus/rules.yml (a
chart reads no file outside it); ``--check`` (run by the tests) exits 1 when one is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
CHART_FILES = ROOT / "helm" / "kdelay" / "files"

# Run as a script (or loaded by path, as the tests do) the checkout's root is not necessarily on
# sys.path; the panel lists live in the dev.tools.grafana package.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dev.tools.grafana.boards import DASHBOARDS  # noqa: E402
from dev.tools.grafana.render import to_json  # noqa: E402


def expected_files() -> dict[Path, bytes]:
    """Every generated or copied file and the bytes it must hold."""
    files: dict[Path, bytes] = {}
    for name, board in DASHBOARDS.items():
        data = to_json(board).encode()
        files[GRAFANA / name] = data
        files[CHART_FILES / "dashboards" / name] = data
    files[CHART_FILES / "rules.yml"] = RULES.read_bytes()
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write (or --check) the dashboards and chart copies."
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, data in expected_files().items():
        if path.exists() and path.read_bytes() == data:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    for rel in stale:
        sys.stdout.write(f"{'out of date' if args.check else 'wrote'}: {rel}\n")
    if args.check and stale:
        sys.stdout.write("run: python dev/tools/dashboards.py\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
