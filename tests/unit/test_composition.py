"""Composition, not inheritance, in the components: no class in ``delay_service/`` or ``proxy/``
derives from another class of the product, except the kinds whose bases are what they are
for: exceptions (one tree, ``test_exception_tree.py``), Protocols, enums, NamedTuples,
TypedDicts, dataclasses (``@dataclass``, ``@immutable``) and pydantic models (settings).

A class split into a base and a subclass to fit the module size cap (``test_module_size.py``)
hides which part owns which state and lets each reach into the other's; a part held by the
class that uses it says so (``Store`` holds its ``scans``, ``writes`` and ``releases``, the
``Forwarder`` its ``control``, the ``Sender`` its ``flights``). The product's source is parsed
(ast, never imported): each class's bases are resolved through its module's imports to the
product class they name, and the chain of that class's own bases followed to what it derives
from outside the product.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The product's source folders, by the package each one is in the wheel.
PRODUCT = {
    "kdelay": ROOT / "kdelay",
    "kdelay.proxy": ROOT / "proxy",
    "kdelay.delay_service": ROOT / "delay_service",
    "kdelay.zk": ROOT / "zk",
    "kdelay.verifier": ROOT / "verifier",
}
#: Where the rule holds.
CHECKED = ("kdelay.delay_service", "kdelay.proxy")
#: Bases from outside the product that make a class one of the allowed kinds.
ALLOWED_ROOTS = {
    "BaseException",
    "Exception",
    "Protocol",
    "Enum",
    "IntEnum",
    "StrEnum",
    "Flag",
    "IntFlag",
    "NamedTuple",
    "TypedDict",
    "BaseModel",
    "BaseSettings",
}
ALLOWED_DECORATORS = {"dataclass", "immutable"}

#: Subclasses of product classes still to turn into compositions; this list only shrinks.
ALLOWLIST = {
    # An exactly-once round is the at-least-once round made one transaction: it overrides how
    # a term loads its checkpoint and how a round sends, settles and checkpoints.
    "kdelay.delay_service.release.exactly_once.ExactlyOnceForwarder"
    "(kdelay.delay_service.release.forwarder.Forwarder)",
    # A sender whose producer is transactional: begin, commit, abort around what Sender sends.
    "kdelay.delay_service.release.txn_sender.TxnSender(kdelay.delay_service.release.sender.Sender)",
}


@dataclass
class ClassInfo:
    bases: list[str]  # dotted names, resolved through the module's imports
    decorators: set[str]


def _module_name(package: str, root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _product_files(roots: dict[str, Path]) -> dict[str, Path]:
    """Every product module by its dotted name (the symbolic links under ``kdelay/`` skipped:
    their folders are read under their own names)."""
    found: dict[str, Path] = {}
    for package, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            if not any((root / p).is_symlink() for p in path.relative_to(root).parents):
                found[_module_name(package, root, path)] = path
    return found


def _dotted(node: ast.expr, names: dict[str, str]) -> str | None:
    """The dotted name a base expression names (``Collection[Target]``: ``Collection``)."""
    if isinstance(node, ast.Subscript):
        return _dotted(node.value, names)
    if isinstance(node, ast.Name):
        return names.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value, names)
        return None if head is None else f"{head}.{node.attr}"
    return None


def _classes(module: str, source: str, is_package: bool) -> dict[str, ClassInfo]:
    tree = ast.parse(source)
    names: dict[str, str] = {}
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
    local = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    names.update({n: f"{module}.{n}" for n in local})
    found: dict[str, ClassInfo] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [d for b in node.bases if (d := _dotted(b, names)) is not None]
        decorators = set()
        for decorator in node.decorator_list:
            target = decorator.func if isinstance(decorator, ast.Call) else decorator
            dotted = _dotted(target, names)
            if dotted is not None:
                decorators.add(dotted.rpartition(".")[2])
        found[f"{module}.{node.name}"] = ClassInfo(bases, decorators)
    return found


def product_classes(roots: dict[str, Path]) -> dict[str, ClassInfo]:
    classes: dict[str, ClassInfo] = {}
    for module, path in _product_files(roots).items():
        source = path.read_text(encoding="utf-8")
        classes.update(_classes(module, source, path.name == "__init__.py"))
    return classes


def _allowed_kind(name: str, classes: dict[str, ClassInfo], seen: frozenset[str]) -> bool:
    """Whether product class ``name`` is one of the allowed kinds, by its decorators or by
    what its bases derive from outside the product."""
    info = classes[name]
    if info.decorators & ALLOWED_DECORATORS:
        return True
    for base in info.bases:
        if base in classes and base not in seen:
            if _allowed_kind(base, classes, seen | {base}):
                return True
        elif base.rpartition(".")[2] in ALLOWED_ROOTS or base.endswith(("Error", "Exception")):
            return True
    return False


def inheritance(roots: dict[str, Path]) -> list[str]:
    """Each class in the checked components that derives from a product class of a kind not
    allowed, as ``module.Class(module.Base)``."""
    classes = product_classes(roots)
    found = []
    for name, info in classes.items():
        if not name.startswith(tuple(f"{c}." for c in CHECKED)):
            continue
        for base in info.bases:
            if base in classes and not _allowed_kind(base, classes, frozenset({base})):
                found.append(f"{name}({base})")
    return sorted(found)


def test_no_component_class_inherits_from_another_product_class() -> None:
    found = inheritance(PRODUCT)
    assert len(product_classes(PRODUCT)) > 250, "the product's classes were not found"
    new = sorted(set(found) - ALLOWLIST)
    assert new == [], (
        "a class inherits from another class of the product; hold it as a part instead "
        "(composition):\n" + "\n".join(new)
    )
    gone = sorted(ALLOWLIST - set(found))
    assert gone == [], "no longer inheriting: remove from ALLOWLIST:\n" + "\n".join(gone)


def test_the_check_tells_a_split_class_from_the_allowed_kinds(tmp_path: Path) -> None:
    pkg = tmp_path / "delay_service"
    (pkg / "parts").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "parts" / "__init__.py").write_text("")
    (pkg / "parts" / "base.py").write_text(
        "from dataclasses import dataclass\n"
        "from typing import Protocol\n"
        "from pydantic import BaseModel\n"
        "from kdelay.errors import KdelayError\n"
        "class State: ...\n"
        "class Like(Protocol): ...\n"
        "class Settings(BaseModel): ...\n"
        "@dataclass\n"
        "class Row: ...\n"
        "class Failed(KdelayError): ...\n"
    )
    (pkg / "parts" / "top.py").write_text(
        "from kdelay.delay_service.parts import base\n"
        "from .base import Like, Row, Settings, State\n"
        "from kdelay.delay_service.parts.base import Failed\n"
        "class Split(State): ...\n"
        "class Qualified(base.State): ...\n"
        "class Impl(Like): ...\n"
        "class More(Settings): ...\n"
        "class Wider(Row): ...\n"
        "class Worse(Failed): ...\n"
        "class Chained(Split): ...\n"
    )
    kdelay = tmp_path / "kdelay"
    kdelay.mkdir()
    (kdelay / "errors.py").write_text("class KdelayError(Exception): ...\n")
    roots = {"kdelay": kdelay, "kdelay.delay_service": pkg}
    top = "kdelay.delay_service.parts.top"
    base = "kdelay.delay_service.parts.base"
    assert inheritance(roots) == [
        f"{top}.Chained({top}.Split)",
        f"{top}.Qualified({base}.State)",
        f"{top}.Split({base}.State)",
    ]
