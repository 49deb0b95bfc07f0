"""The test kit's own rules: no test module imports another test module; no sleep without
its reason.

A helper one test module takes from another ties the tiers together (tests/spark could not be
collected without tests/integration's module, and its fixtures and constants came along) and
hides what is shared; shared helpers live in tests/support, named by what they hold. Every test
module of every tier is parsed (ast, never imported) and each offending import named.

A test waits on a condition with a deadline (``dev.stack.wait_until``), never a guessed number
of seconds. A sleep stays only where time passing is what is tested (an absence window, a
fault's duration, a sending rate, the wall clock itself) or as the poll interval of a wait with
a deadline, and says so in a ``# sleep:`` comment on its line or the line before; every line of
every file under tests/ is read, the code that tests run in child processes included.

A test uses what it tests through its public API or a seam made for it (a constructor
argument, a read-only property, an injected part it keeps), never by reaching into private
state: ``x._name`` (``x`` not ``self``/``cls``/``super()``) and ``setattr(x, "_name", ...)``
are found in every test module (ast), the support code under tests/support excepted; the
remaining ones are listed by name, and that list only shrinks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PKG = "tests"
TIERS = ("unit", "integration", "e2e", "deploy", "spark", "packaging")
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


#: A sleep call: ``time`` 's, or one imported by name; not an ``asyncio`` one, not a definition.
SLEEP = re.compile(r"(?<![\w.])(?<!def )(?:time\.)?sleep\(")
#: What the comment giving a sleep's reason starts with.
REASON = "# sleep:"


def unexplained_sleeps(source: str, where: str) -> list[str]:
    """Each sleep in ``source`` without a ``# sleep:`` comment on its line or the line before."""
    lines = source.splitlines()
    return [
        f"{where}:{n}: {line.strip()}"
        for n, line in enumerate(lines, start=1)
        if SLEEP.search(line) and REASON not in line and (n == 1 or REASON not in lines[n - 2])
    ]


def test_every_sleep_in_the_tests_says_why_it_is_not_a_wait() -> None:
    sources = sorted(TESTS.rglob("*.py"))
    assert len(sources) > 150, "the test sources were not found"
    unexplained = [
        hit
        for path in sources
        for hit in unexplained_sleeps(
            path.read_text(encoding="utf-8"), str(path.relative_to(TESTS.parent))
        )
    ]
    assert unexplained == [], (
        "a sleep without its reason: wait on the condition instead (dev.stack.wait_until), or, "
        f"where time passing is what is tested, say so in a '{REASON} ...' comment on its line "
        "or the line before:\n" + "\n".join(unexplained)
    )


def test_the_sleep_check_sees_each_form_and_accepts_a_reason() -> None:
    nap = "sle" + "ep"  # apart, so the check does not find these lines here
    source = (
        f"time.{nap}(2)\n"
        f"from time import {nap}\n"
        f"{nap}(0.5)\n"
        f"x = 1; time.{nap}(1)  # waiting for the master\n"
        f"time.{nap}(3)  {REASON} an absence window\n"
        f"{REASON} the fault's duration\n"
        f"time.{nap}(4)\n"
        f"await asyncio.{nap}(1)\n"
        f"clock.{nap}(5)\n"
        f"def {nap}(self, s: float) -> None: ...\n"
        f'code = "import time; time.{nap}(300)"\n'
    )
    hits = unexplained_sleeps(source, "tests/unit/probe.py")
    assert [int(h.split(":")[1]) for h in hits] == [1, 3, 4, 11], hits
    assert hits[0] == f"tests/unit/probe.py:1: time.{nap}(2)"


#: Calls that name an attribute by a string: ``setattr(x, "_y", v)``, ``monkeypatch.setattr``.
BY_NAME = ("setattr", "getattr", "delattr", "hasattr")
#: Private reaches that remain, as ``path: expression``; this list only shrinks.
PRIVATE_REACHES = {
    # pyspark exposes the JVM's SparkContext only as ``_jsc``: the Spark cluster's own check.
    "tests/spark/test_spark_cluster.py: session.sparkContext._jsc",
}


def _is_private(name: str) -> bool:
    """``_x``, not a dunder, and not all capitals: a library's constant (confluent-kafka's
    ``KafkaError._MSG_TIMED_OUT``, its public error codes)."""
    return (
        name.startswith("_")
        and not name.startswith("__")
        and not re.fullmatch(r"_[A-Z0-9_]+", name)
    )


def private_reaches(source: str, where: str) -> list[str]:
    """Each private attribute ``source`` reaches, as ``where:line: expression``."""
    found = []
    for node in ast.walk(ast.parse(source, filename=where)):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if (
                isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"
            ):
                continue
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).rpartition(".")[2] in BY_NAME
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _is_private(node.args[1].value)
        ):
            found.append(
                f"{where}:{node.lineno}: {ast.unparse(node.func)}(..., {node.args[1].value!r})"
            )
    return sorted(found, key=lambda hit: int(hit.split(":")[1]))


def _without_line(hit: str) -> str:
    where, _line, expression = hit.split(":", 2)
    return f"{where}:{expression}"


def test_no_test_reaches_into_private_state() -> None:
    sources = sorted(p for p in TESTS.rglob("*.py") if "support" not in p.relative_to(TESTS).parts)
    assert len(sources) > 150, "the test sources were not found"
    hits = [
        hit
        for path in sources
        for hit in private_reaches(
            path.read_text(encoding="utf-8"), str(path.relative_to(TESTS.parent))
        )
    ]
    new = [hit for hit in hits if _without_line(hit) not in PRIVATE_REACHES]
    assert new == [], (
        "a test reaches into private state: give what it needs a seam (a constructor "
        "argument, a read-only property, a part the test injects and keeps):\n" + "\n".join(new)
    )
    gone = PRIVATE_REACHES - {_without_line(hit) for hit in hits}
    assert not gone, "no longer reached: remove from PRIVATE_REACHES:\n" + "\n".join(sorted(gone))


def test_the_private_reach_check_sees_each_form() -> None:
    source = (
        "store._db[key] = value\n"
        "rig.fwd._sender.start()\n"
        "self._own = 1\n"
        "cls._shared = 2\n"
        "super()._hook()\n"
        "x.__class__\n"
        "KafkaError._MSG_TIMED_OUT\n"
        'monkeypatch.setattr(module, "_wall_ms", clock)\n'
        'monkeypatch.setattr(module, "PUBLIC", 1)\n'
        "store.floor\n"
    )
    hits = private_reaches(source, "tests/unit/probe.py")
    assert hits == [
        "tests/unit/probe.py:1: store._db",
        "tests/unit/probe.py:2: rig.fwd._sender",
        "tests/unit/probe.py:8: monkeypatch.setattr(..., '_wall_ms')",
    ], hits
