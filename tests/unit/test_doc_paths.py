"""ARCHITECTURE.md and every package's docstring name only paths and modules that exist.

Read by someone new to the code, a map that names a file which moved or never existed sends
them nowhere. Checked: every backticked path-like token (``a/b``, ``x.py``) in ARCHITECTURE.md
and in each package's ``__init__`` docstring exists (from the repository's root, from the
package's folder, or for a bare file name anywhere in the checkout); every ``:mod:`` reference
names a module file; and the modules a package docstring lists after ``Modules:`` exist in it.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["kdelay", "proxy", "delay_service", "zk", "verifier", "dev", "bench", "tests"]
#: Not the checkout's files: Kafka's own tools, and directories made at run time.
NOT_OURS = ("kafka-acls.sh", "kafka-configs.sh", ".cache/", ".kdelay/", ".venv/")
_TICKED = re.compile(r"`+([^`\s]+?)`+")
_PATHLIKE = re.compile(r"^[\w.-]+(/[\w.-]+)*/?$")
_FILE = re.compile(r"\.(py|md|ya?ml|toml|sh|json|tpl|txt)$")
_MOD = re.compile(r":mod:`~?([\w.]+)`")


def _package_docs() -> list[Path]:
    out: list[Path] = []
    for name in PACKAGES:
        out += [p for p in (ROOT / name).rglob("__init__.py") if ".venv" not in p.parts]
    return sorted(out)


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


@cache
def _file_names() -> frozenset[str]:
    return frozenset(
        p.name
        for p in ROOT.rglob("*")
        if not {".venv", ".git", ".cache", "node_modules"} & set(p.parts)
    )


def _paths(text: str) -> list[str]:
    found = []
    for ticked in _TICKED.findall(text):
        token = ticked.rstrip(".,:;)")
        if token.startswith(NOT_OURS) or token in NOT_OURS:
            continue
        if "/" not in token and not _FILE.search(token):
            continue
        if token.startswith(("http", "/", "~", ".")) or not _PATHLIKE.match(token):
            continue
        if "/" in token and "." in token.split("/")[0]:  # a host or image name, not a path
            continue
        found.append(token)
    return found


def _exists(token: str, base: Path) -> bool:
    if (ROOT / token).exists() or (base / token).exists():
        return True
    if "/" not in token:
        return token in _file_names()
    return (ROOT / f"{token}.py").exists()  # a module named by its path: dev/kafka_tools


def _module_exists(name: str, base: Path) -> bool:
    """``name`` (``a.b``, or ``.b`` relative to the package at ``base``) is a module file."""
    path = (base if name.startswith(".") else ROOT).joinpath(*name.lstrip(".").split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_architecture_names_only_existing_paths() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    missing = [t for t in _paths(text) if not _exists(t, ROOT)]
    assert missing == []


@pytest.mark.parametrize("init", _package_docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_package_docstring_names_only_existing_paths_and_modules(init: Path) -> None:
    doc = _docstring(init)
    base = init.parent
    missing = [t for t in _paths(doc) if not _exists(t, base)]
    missing += [m for m in _MOD.findall(doc) if not _module_exists(m, base)]
    listed = re.search(r"Modules:(.*?)(?:\n\n|$)", doc, re.S)
    if listed:
        for name in re.findall(r"``(\w+)``", listed.group(1)):
            if not ((base / f"{name}.py").exists() or (base / name / "__init__.py").exists()):
                missing.append(f"{base.name}.{name}")
    assert missing == []
