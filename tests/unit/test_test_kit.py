"""The test kit's own rule: no test module imports another test module.

A helper one test module takes from another ties the tiers together (tests/spark could not be
collected without tests/integration's module, and its fixtures and constants came along) and
hides what is shared; shared helpers live in tests/support, named by what they hold. Every test
module of every tier is parsed (ast, never imported) and each offending import named.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PKG = "tests"
TIERS = ("unit", "integration", "e2e", "containers", "k8s", "spark", "packaging")
#: ``tests.<tier>.test_x`` (or deeper): a test module, by its dotted name.
TEST_MODULE = re.compile(r"^tests(\.\w+)*\.test_\w*$")


def offending_imports(source: str, where: str) -> list[str]:
    """Each import of a test module in ``source``, as ``where:line: imports name``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source, filename=where)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if TEST_MODULE.match(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level:
            # Relative: a test_ module in the dotted path, or one imported by name.
            parts = node.module.split(".") if node.module else []
            named = [a.name for a in node.names if a.name.startswith("test_")]
            if any(p.startswith("test_") for p in parts):
                names = ["." * node.level + (node.module or "")]
            else:
                dots = "." * node.level + (f"{node.module}." if node.module else "")
                names = [dots + n for n in named]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if TEST_MODULE.match(module):
                names = [module]
            else:  # ``from tests.unit import test_queries``
                dotted = (f"{module}.{a.name}" for a in node.names)
                names = [n for n in dotted if TEST_MODULE.match(n)]
        else:
            continue
        found += [f"{where}:{node.lineno}: imports {name}" for name in names]
    return found


def all_test_modules() -> list[Path]:
    return sorted(p for tier in TIERS for p in (TESTS / tier).rglob("test_*.py"))


def test_no_test_module_imports_another_test_module() -> None:
    modules = all_test_modules()
    assert len(modules) > 100, "the test modules were not found"
    offending = [
        hit
        for path in modules
        for hit in offending_imports(
            path.read_text(encoding="utf-8"), str(path.relative_to(TESTS.parent))
        )
    ]
    assert offending == [], (
        "a test module imports another test module; move what they share to tests/support:\n"
        + "\n".join(offending)
    )


def test_the_check_sees_every_form_of_such_an_import() -> None:
    # The package name apart, so a grep for such imports does not find these lines.
    source = (
        f"import {PKG}.unit.test_queries\n"
        f"from {PKG}.integration.test_verifier_once import build_faults\n"
        f"from {PKG}.unit import test_queries as q\n"
        "from . import test_listing\n"
        "from .test_listing import fill\n"
        "from ..integration.test_verifier_continuous import x\n"
        "def f() -> None:\n"
        f"    from {PKG}.spark.test_spark_cluster import Streaming\n"
        f"from {PKG}.support.replica_answers import serving\n"
        f"from {PKG}.support import oracle\n"
        "from . import conftest\n"
        f"import {PKG}.support.infra\n"
    )
    hits = offending_imports(source, "tests/unit/probe.py")
    assert [int(h.split(":")[1]) for h in hits] == [1, 2, 3, 4, 5, 6, 8], hits
    assert hits[2] == "tests/unit/probe.py:3: imports tests.unit.test_queries"
    assert hits[3] == "tests/unit/probe.py:4: imports .test_listing"
