"""Every third-party module the runtime code imports is a declared dependency.

A package that the dev extras happen to pull in (PyYAML came with the test tools) would make
`pip install kdelay` -- and the container image -- fail at import time while every test passed.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("kdelay", "proxy", "delay_service", "zk", "verifier")
#: Modules that only the [verifier] extra provides (pyspark), and the files that may use them.
EXTRA_ONLY = {"verifier": {"verifier/job.py", "verifier/stream.py", "verifier/source.py"}}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> tuple[set[str], dict[str, set[str]]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    return {_name(r) for r in project["dependencies"]}, extras


def _type_checking_only(tree: ast.Module) -> set[ast.AST]:
    """Nodes under ``if TYPE_CHECKING:``: never imported at run time."""
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for child in node.body:
                skipped.update(ast.walk(child))
    return skipped


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_runtime_imports_are_declared_dependencies() -> None:
    declared, extras = _declared()
    dists = packages_distributions()
    local = set(RUNTIME) | set(sys.stdlib_module_names) | {"__future__"}
    missing: list[str] = []
    for package in RUNTIME:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            allowed = set(declared)
            for extra, files in EXTRA_ONLY.items():
                if rel in files:
                    allowed |= extras[extra]
            for module in sorted(_imports(path) - local):
                names = {d.lower().replace("_", "-") for d in dists.get(module, [module])}
                if not names & allowed:
                    missing.append(f"{rel}: {module} ({', '.join(sorted(names))})")
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(missing)
