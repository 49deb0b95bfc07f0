"""pyproject.toml's dependencies and what the code uses agree, both ways.

Declared (a dependency missing breaks an install while every test passes): a package that the
dev extras happen to pull in (PyYAML came with the test tools) would make `pip install kdelay`
-- and the container image -- fail at import time. Every third-party module the product
(kdelay, proxy, delay_service, zk, verifier) imports at run time is a runtime dependency, or,
in the files only `kdelay verify` loads, the verifier extra's; what the harness (tests, bench,
dev, examples) imports is declared somewhere `make install` installs.

Used (a dependency nothing uses costs every install its download and its vulnerabilities):
every runtime dependency and every extra's is imported by the product, or loaded by one of its
dependencies (INDIRECT, each with its reason, checked still to be so); every dev dependency is
imported by the harness, a command `make`, .ci/run or the pre-commit hooks run, a pytest plugin
whose option they set (PLUGINS), or the stubs of a module the type-checked code imports.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from collections.abc import Mapping
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ("kdelay", "proxy", "delay_service", "zk", "verifier")
HARNESS = ("tests", "bench", "dev", "examples")
#: Modules that only an extra provides, and the files that may use them (imported only by
#: `kdelay verify`, lazily, with the Spark job).
EXTRA_ONLY = {
    "verifier": {
        "verifier/job.py",
        "verifier/matching.py",
        "verifier/aggregates.py",
        "verifier/quantiles.py",
        "verifier/stream.py",
        "verifier/source.py",
        "verifier/chart.py",
    }
}
#: Runtime dependencies no kdelay module imports: distribution -> (the module that loads it, the
#: module name it imports, why it is declared).
INDIRECT = {
    "crc32c": (
        "kafka.record.util",
        "crc32c",
        "kafka-python verifies record-batch CRCs in pure Python without it (75% of proxy CPU)",
    ),
}
#: pytest plugins and the docs site's theme: distribution -> (file, what in it turns it on).
PLUGINS = {
    "mkdocs-material": ("mkdocs.yml", r"(?m)^  name: material$"),
    "pytest-cov": ("Makefile", r"--cov\b"),
    "pytest-timeout": ("pyproject.toml", r"(?m)^timeout = \d+"),
    "pytest-xdist": ("Makefile", r"--dist loadfile"),
}
#: Where the development commands are run from.
COMMAND_FILES = ("Makefile", ".ci/run", ".pre-commit-config.yaml")


@functools.cache
def _providers() -> Mapping[str, list[str]]:
    """Top-level module -> the distributions that provide it (a scan of every installed one)."""
    return metadata.packages_distributions()


def _dist(name: str) -> str:
    """A distribution's normalised name (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name(requirement: str) -> str:
    return _dist(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0])


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


def _imports(path: Path, *, run_time_only: bool = True) -> set[str]:
    """The top-level modules ``path`` imports (at run time only, unless told otherwise)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    skipped = _type_checking_only(tree) if run_time_only else set()
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _files(packages: tuple[str, ...]) -> list[Path]:
    return [path for package in packages for path in sorted((ROOT / package).rglob("*.py"))]


def _third_party(path: Path, *, run_time_only: bool = True) -> dict[str, set[str]]:
    """The third-party modules ``path`` imports, each with the distributions that provide it."""
    dists = _providers()
    local = {*RUNTIME, *HARNESS, *sys.stdlib_module_names, "__future__"}
    return {
        module: {_dist(d) for d in dists.get(module, [module])}
        for module in _imports(path, run_time_only=run_time_only) - local
    }


def _used_by(packages: tuple[str, ...], *, run_time_only: bool = True) -> set[str]:
    return {
        d
        for path in _files(packages)
        for names in _third_party(path, run_time_only=run_time_only).values()
        for d in names
    }


def test_runtime_imports_are_declared_dependencies() -> None:
    declared, extras = _declared()
    missing: list[str] = []
    for path in _files(RUNTIME):
        rel = path.relative_to(ROOT).as_posix()
        allowed = set(declared)
        for extra, files in EXTRA_ONLY.items():
            if rel in files:
                allowed |= extras[extra]
        for module, names in sorted(_third_party(path).items()):
            if not names & allowed:
                missing.append(f"{rel}: {module} ({', '.join(sorted(names))})")
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(missing)


def test_harness_imports_are_declared_somewhere_make_install_installs() -> None:
    declared, extras = _declared()
    allowed = declared | extras["dev"] | extras["verifier"]
    missing = [
        f"{path.relative_to(ROOT).as_posix()}: {module} ({', '.join(sorted(names))})"
        for path in _files(HARNESS)
        for module, names in sorted(_third_party(path, run_time_only=False).items())
        if not names & allowed
    ]
    assert not missing, "imported but not declared in pyproject.toml:\n" + "\n".join(missing)


def test_every_runtime_dependency_is_used() -> None:
    declared, _ = _declared()
    used = _used_by(RUNTIME)
    for dist, (loader, module, _why) in INDIRECT.items():
        owners = {_dist(d) for d in _providers()[loader.split(".")[0]]}
        assert owners & used, f"{dist}: {loader} is no longer a dependency kdelay imports"
        spec = find_spec(loader)
        assert spec is not None
        assert spec.origin is not None
        source = Path(spec.origin).read_text()
        loads = rf"^\s*(import {module}\b|from {module} import)"
        assert re.search(loads, source, re.MULTILINE), f"{dist}: {loader} no longer imports it"
    unused = declared - used - set(INDIRECT)
    assert not unused, (
        f"declared in [project] dependencies, imported by no product module: {unused}"
    )


def test_every_extras_dependency_is_used() -> None:
    _, extras = _declared()
    for extra, files in EXTRA_ONLY.items():
        used = {d for rel in files for names in _third_party(ROOT / rel).values() for d in names}
        unused = extras[extra] - used
        assert not unused, (
            f"the {extra} extra declares what none of {sorted(files)} imports: {unused}"
        )


def _commands(dist: str) -> set[str]:
    """The commands a distribution installs: its console scripts and its binaries (ruff)."""
    installed = metadata.distribution(dist)
    scripts = {e.name for e in installed.entry_points if e.group == "console_scripts"}
    return scripts | {Path(f).name for f in installed.files or () if Path(f).parent.name == "bin"}


def _stubbed_modules(dist: str) -> set[str]:
    """The modules a stub-only distribution (``types-X``) types: its ``<module>-stubs``."""
    return {
        module.removesuffix("-stubs")
        for module, dists in _providers().items()
        if module.endswith("-stubs") and dist in {_dist(d) for d in dists}
    }


def test_every_dev_dependency_is_used() -> None:
    _, extras = _declared()
    imported = _used_by(HARNESS, run_time_only=False)
    checked = {m for p in _files((*RUNTIME, *HARNESS)) for m in _imports(p, run_time_only=False)}
    commands = "\n".join((ROOT / f).read_text() for f in COMMAND_FILES)
    unused: list[str] = []
    for dist in sorted(extras["dev"]):
        if dist in imported:
            continue
        if any(re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", commands) for s in _commands(dist)):
            continue
        if dist in PLUGINS:
            file, evidence = PLUGINS[dist]
            if re.search(evidence, (ROOT / file).read_text()):
                continue
        if _stubbed_modules(dist) & checked:
            continue
        unused.append(dist)
    assert not unused, f"the dev extra declares what nothing uses: {unused}"
