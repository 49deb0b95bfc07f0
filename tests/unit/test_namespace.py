"""One namespace: the product is imported as ``kdelay`` and its components below it.

The components keep their folders at the checkout's top (``proxy/``, ``delay_service/``,
``zk/``, ``verifier/``); ``kdelay/`` holds symbolic links to them and pyproject.toml's
package-dir maps them for the wheel (tests/packaging/test_wheel.py checks the wheel's top-level
names). An import of a component by its folder name would load a second copy of its modules
beside ``kdelay.<component>``: these tests fail naming each one.
"""

from __future__ import annotations

import ast
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("proxy", "delay_service", "zk", "verifier")


def _python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [ROOT / rel for rel in filter(None, listed.split("\0")) if (ROOT / rel).is_file()]


def _top_level_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.split(".")[0] in COMPONENTS]


def test_no_module_imports_a_component_by_its_folder_name() -> None:
    offenders = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        offenders += [
            f"{path.relative_to(ROOT)}:{line}: {name} (import kdelay.{name})"
            for line, name in _top_level_imports(tree)
        ]
    assert not offenders, "\n".join(offenders)


def test_the_check_finds_a_component_imported_by_its_folder_name() -> None:
    tree = ast.parse("import proxy.app\nfrom zk import Paths\nfrom kdelay.zk import Paths\n")
    assert _top_level_imports(tree) == [(1, "proxy.app"), (2, "zk")]


def test_kdelay_links_each_component_to_its_folder() -> None:
    for name in COMPONENTS:
        link = ROOT / "kdelay" / name
        assert link.is_symlink(), f"kdelay/{name} is not a symbolic link to ../{name}"
        assert link.resolve() == (ROOT / name).resolve()


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_of_the_checkout_is_in_the_wheel_list() -> None:
    setuptools = _pyproject()["tool"]["setuptools"]  # type: ignore[index]
    listed, mapped = set(setuptools["packages"]), setuptools["package-dir"]
    assert mapped == {f"kdelay.{c}": c for c in COMPONENTS}
    found = set()
    for init in (ROOT / "kdelay").rglob("__init__.py"):
        if "__pycache__" not in init.parts:
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    for name in COMPONENTS:  # rglob does not follow the links
        for init in (ROOT / name).rglob("__init__.py"):
            found.add(".".join(("kdelay", *init.parent.relative_to(ROOT).parts)))
    assert listed == found, f"missing {sorted(found - listed)}, extra {sorted(listed - found)}"


def test_the_shared_contract_lists_every_module_of_kdelay_itself() -> None:
    contracts = _pyproject()["tool"]["importlinter"]["contracts"]  # type: ignore[index]
    (shared,) = [c for c in contracts if c["name"].startswith("The shared contract")]
    own = {
        f"kdelay.{p.stem}"
        for p in (ROOT / "kdelay").iterdir()
        if not p.is_symlink()
        and p.name != "__init__.py"
        and (p.suffix == ".py" or (p / "__init__.py").exists())
    }
    assert set(shared["source_modules"]) == own
