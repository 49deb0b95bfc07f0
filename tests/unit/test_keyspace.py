"""The delay service's RocksDB keyspace has one owner: ``delay_service/store/keyspace.py``.

Every key prefix and every ``struct`` format of a key or value lives there. Written anywhere
else in the delay service, a second spelling of a prefix or a format can drift from the first
and a store written by one module would be misread by another. An AST scan fails on a non-empty
bytes literal or a ``struct`` format (``struct.Struct``, ``struct.pack``, ``struct.unpack``, ...)
in any other delay_service module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "delay_service"
OWNER = PACKAGE / "store" / "keyspace.py"
_STRUCT_CALLS = {"Struct", "pack", "pack_into", "unpack", "unpack_from", "iter_unpack", "calcsize"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p != OWNER)


def _offences(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out: list[str] = []
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, bytes) and node.value:
            if id(node) not in docstrings:
                out.append(f"line {node.lineno}: bytes literal {node.value!r}")
        elif isinstance(node, ast.ImportFrom) and node.module == "struct":
            out.append(f"line {node.lineno}: from struct import ...")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "struct"
            and node.attr in _STRUCT_CALLS
        ):
            out.append(f"line {node.lineno}: struct.{node.attr}")
    return out


def test_the_keyspace_module_exists_and_holds_the_formats() -> None:
    text = OWNER.read_text()
    assert "struct.Struct(" in text
    assert 'b"cancel/' in text


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_other_delay_service_module_spells_a_key_prefix_or_format(path: Path) -> None:
    assert _offences(path) == []
