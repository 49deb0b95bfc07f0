"""Writes the values table of helm/kdelay/README.md from the `# --` comments in values.yaml.

helm-docs style: the comment lines starting with ``# --`` directly above a key describe it. Every
leaf value (a scalar, a list, or a mapping written inline such as ``{}``) must have one; a leaf
without a description (its own, or one on a mapping above it) is an error, so no value goes
undocumented. The table lives between the
``<!-- values:start -->`` and ``<!-- values:end -->`` markers. ``--check`` exits 1 when the
README is out of date or a value lacks a description (the tests run it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kdelay"
START, END = "<!-- values:start -->", "<!-- values:end -->"
_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


def documented_leaves(text: str) -> list[tuple[str, str | None, bool]]:
    """(dotted key, description or None, is_leaf) for every key, in file order."""
    out: list[tuple[str, str | None, bool]] = []
    path: list[tuple[int, str]] = []
    comment: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and comment:
            comment.append(stripped.lstrip("#").strip())
            continue
        match = _KEY.match(line)
        if not match:
            if not stripped.startswith("#"):
                comment = []
            continue
        indent = len(match["indent"])
        while path and path[-1][0] >= indent:
            path.pop()
        path.append((indent, match["key"]))
        rest = match["rest"].split(" #")[0].strip()
        nxt = next((n for n in lines[i + 1 :] if n.strip() and not n.strip().startswith("#")), "")
        nested = (
            not rest and len(nxt) - len(nxt.lstrip()) > indent and not nxt.lstrip().startswith("- ")
        )
        dotted = ".".join(k for _, k in path)
        out.append((dotted, " ".join(comment) or None, not nested))
        comment = []
    return out


def _lookup(values: dict[str, Any], dotted: str) -> Any:
    node: Any = values
    for part in dotted.split("."):
        node = node[part]
    return node


_TYPES = ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"), (list, "list"))


def _type(value: Any) -> str:
    if value is None:
        return "null"
    return next((name for cls, name in _TYPES if isinstance(value, cls)), "object")


def table() -> tuple[str, list[str]]:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    missing = []
    covered: list[str] = []  # a described mapping documents everything under it (helm-docs)
    for dotted, description, leaf in documented_leaves(text):
        if any(dotted.startswith(c + ".") for c in covered):
            continue
        if not leaf and description is None:
            continue
        if not leaf:
            covered.append(dotted)
        if description is None:
            missing.append(dotted)
            continue
        value = _lookup(values, dotted)
        default = json.dumps(value, separators=(", ", ": ")).replace("|", "\\|")
        text_ = description.replace("|", "\\|")
        rows.append(f"| `{dotted}` | {_type(value)} | `{default}` | {text_} |")
    return "\n".join(rows) + "\n", missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write (or --check) the chart README values table."
    )
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    rendered, missing = table()
    for key in missing:
        sys.stdout.write(f"values.yaml: `{key}` has no '# --' description\n")
    readme = CHART / "README.md"
    text = readme.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    updated = f"{head}{START}\n{rendered}{END}{tail}"
    if args.check:
        if updated != text:
            sys.stdout.write(
                "helm/kdelay/README.md is out of date: python dev/tools/chart_readme.py\n"
            )
            return 1
        return 1 if missing else 0
    readme.write_text(updated)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
