"""The wheel ships the product and nothing of the development harness, and runs on its own.

The wheel is built (``pip wheel --no-deps``) from a copy of the checkout's sources (what git
tracks or would track: no caches, no stale ``build/``), so the test sees what setuptools packs from
this tree and never writes into it. Then it is installed, with ``constraints.txt``, into a fresh
virtual environment outside the checkout, and the installed commands run there. Marked
``integration``: it runs pip, which fetches the build backend and the dependencies (pip's cache
makes a second run quick).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: The one top-level package the wheel installs.
TOP_LEVEL = "kdelay"
#: The product's packages: kdelay's components keep their folders at the checkout's top
#: (pyproject.toml's package-dir maps them below kdelay).
PRODUCT = {
    "kdelay": "kdelay",
    "kdelay/proxy": "proxy",
    "kdelay/delay_service": "delay_service",
    "kdelay/zk": "zk",
    "kdelay/verifier": "verifier",
}
#: The development harness (dev/, tests/, bench/) and where it lived before it moved to dev/.
HARNESS = (
    "dev/*",
    "tests/*",
    "bench/*",
    "kdelay/local/*",
    "kdelay/containers/*",
    "kdelay/k8s/*",
    "kdelay/demo.py",
    "kdelay/up.py",
    "*kafka_tools*",
)


def _run(*args: str | Path, cwd: Path, timeout: float = 480) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        [str(a) for a in args],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _sources(copy: Path) -> None:
    """The checkout's files as git sees them (tracked, or untracked and not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():  # a tracked file may be deleted in the working tree
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / rel)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout: the wheel is built from the files git knows")
    work = tmp_path_factory.mktemp("wheel")
    source, dist = work / "src", work / "dist"
    _sources(source)
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", source, "-w", dist, cwd=work)
    assert built.returncode == 0, built.stdout + built.stderr
    (found,) = dist.glob("kdelay-*.whl")
    return found


def test_the_wheel_holds_the_product_and_none_of_the_harness(wheel: Path) -> None:
    names = sorted(zipfile.ZipFile(wheel).namelist())
    print(f"{wheel.name}: {len(names)} files", *names, sep="\n  ")
    harness = [n for n in names if any(fnmatch.fnmatch(n, p) for p in HARNESS)]
    assert not harness, f"development harness in the wheel: {harness}"
    for package, folder in PRODUCT.items():
        assert f"{package}/__init__.py" in names
        assert f"{package}/py.typed" in names
        others = tuple(f"{p}/" for p in PRODUCT if p != package and p.startswith(f"{package}/"))
        shipped = {
            n
            for n in names
            if n.startswith(f"{package}/") and n.endswith(".py") and not n.startswith(others)
        }
        source = {
            f"{package}/{p.relative_to(ROOT / folder).as_posix()}"
            for p in (ROOT / folder).rglob("*.py")
            if "__pycache__" not in p.parts
        }
        assert shipped == source, f"{package}: missing {source - shipped}, extra {shipped - source}"
    poms = {p.relative_to(ROOT).as_posix() for p in (ROOT / "kdelay/jvm").glob("*/pom.xml")}
    assert poms, "kdelay/jvm has no poms"
    assert poms | {"kdelay/jvm/settings.xml"} <= set(names)
    # The operator's console (proxy/http/console.py serves /ui/ from the installed package).
    console = {
        f"kdelay/proxy/http/console/{p.name}" for p in (ROOT / "proxy/http/console").iterdir()
    }
    assert console >= {
        "kdelay/proxy/http/console/index.html",
        "kdelay/proxy/http/console/console.js",
    }
    assert console <= set(names), f"console files missing: {console - set(names)}"
    top_level = {n.split("/")[0] for n in names} - _dist_info(names)
    assert top_level == {TOP_LEVEL}, f"the wheel installs other top-level names: {top_level}"
    info = _dist_info(names).pop()
    declared = zipfile.ZipFile(wheel).read(f"{info}/top_level.txt").decode().split()
    assert declared == [TOP_LEVEL], f"top_level.txt names {declared}"
    licence = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    assert licence, "the wheel carries no LICENSE"
    metadata = zipfile.ZipFile(wheel).read(_dist_info(names).pop() + "/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata


def _dist_info(names: list[str]) -> set[str]:
    return {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}


def test_the_installed_wheel_runs_without_the_checkout(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    created = _run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    python, kdelay = venv / "bin" / "python", venv / "bin" / "kdelay"
    constraints = ROOT / "constraints.txt"
    installed = _run(python, "-m", "pip", "install", "-c", constraints, wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stdout + installed.stderr

    for command in ("proxy", "delay-service"):
        helped = _run(kdelay, command, "--help", cwd=tmp_path, timeout=120)
        assert helped.returncode == 0, helped.stderr
        assert "Usage:" in helped.stdout
    # The consumer retry helper's public API (CONTRACT.md).
    imported = _run(
        python,
        "-c",
        "import kdelay.retry; assert kdelay.retry.RetryingConsumer and kdelay.retry.RetryPolicy",
        cwd=tmp_path,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stderr
    # The console's files load from the installed package (what /ui/ serves).
    console = _run(
        python,
        "-c",
        "from kdelay.proxy.http.console import load_assets as a;"
        " assert b'/ui/console.js' in a()['index.html']",
        cwd=tmp_path,
        timeout=120,
    )
    assert console.returncode == 0, console.stderr
    # `kdelay up` is the development stack: outside a checkout it says where that lives.
    up = _run(kdelay, "up", cwd=tmp_path, timeout=120)
    assert up.returncode != 0
    assert "source checkout" in up.stderr, up.stderr
    assert "Traceback" not in up.stderr, up.stderr
