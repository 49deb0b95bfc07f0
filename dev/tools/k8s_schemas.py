"""Offline Kubernetes JSON schemas for kubeconform, from the `kubernetes-validate` wheel (PyPI).

The wheel holds, per Kubernetes minor version, ``vX.Y.Z-local-strict/_definitions.json`` (every
OpenAPI definition under ``$defs``) and one file per kind whose ``$ref``s point into it as
``/api/_definitions.json#/$defs/NAME``. kubeconform wants self-contained files, so each kind is
written with its refs rewritten to ``#/$defs/NAME`` and exactly the definitions it reaches, into
``<out>/vX.Y.Z-standalone-strict/<kind>-<group>-<version>.json`` -- the layout of
yannh/kubernetes-json-schema, which kubeconform's ``-schema-location`` template expects.

Usage: python k8s_schemas.py --wheel kubernetes_validate-*.whl --out DIR 1.29.0 1.35.0
"""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

_EXTERNAL = "/api/_definitions.json#/$defs/"
_LOCAL = "#/$defs/"


def _rewrite(node: Any, reached: set[str]) -> Any:
    """Copy ``node`` with external refs made local; collect the definition names it refers to."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                ref = _LOCAL + value[len(_EXTERNAL) :] if value.startswith(_EXTERNAL) else value
                if ref.startswith(_LOCAL):
                    reached.add(ref[len(_LOCAL) :])
                out[key] = ref
            else:
                out[key] = _rewrite(value, reached)
        return out
    if isinstance(node, list):
        return [_rewrite(item, reached) for item in node]
    return node


def standalone(kind_schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """``kind_schema`` with the transitive closure of the definitions it refers to inlined."""
    reached: set[str] = set()
    schema: dict[str, Any] = _rewrite(kind_schema, reached)
    schema.pop("$id", None)
    defs: dict[str, Any] = {}
    todo = sorted(reached)
    while todo:
        name = todo.pop()
        if name in defs:
            continue
        more: set[str] = set()
        defs[name] = _rewrite(definitions[name], more)
        todo.extend(sorted(more - defs.keys()))
    schema["$defs"] = defs
    return schema


def generate(wheel: Path, out: Path, version: str) -> int:
    """Write the standalone-strict schemas of one Kubernetes version; return how many."""
    prefix = f"kubernetes_validate/kubernetes-json-schema/v{version}-local-strict/"
    target = out / f"v{version}-standalone-strict"
    target.mkdir(parents=True, exist_ok=True)
    count = 0
    with zipfile.ZipFile(wheel) as whl:
        names = [n for n in whl.namelist() if n.startswith(prefix) and n.endswith(".json")]
        if not names:
            raise SystemExit(f"{wheel.name} has no schemas for Kubernetes {version}")
        definitions = json.loads(whl.read(prefix + "_definitions.json"))["$defs"]
        for name in names:
            filename = name[len(prefix) :]
            if filename.startswith("_") or "/" in filename:
                continue
            schema = standalone(json.loads(whl.read(name)), definitions)
            (target / filename).write_text(json.dumps(schema, separators=(",", ":")))
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("versions", nargs="+", help="Kubernetes versions, e.g. 1.35.0")
    args = parser.parse_args(argv)
    for version in args.versions:
        count = generate(args.wheel, args.out, version)
        sys.stdout.write(f"==> [deploy-tools] Kubernetes {version}: {count} schemas written\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
