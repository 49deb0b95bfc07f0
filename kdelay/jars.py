"""The pinned JVM jars (Kafka, ZooKeeper, Spark's Kafka connector): where they are, fetching them.

This is runtime code: ``kdelay jvm fetch``, the verifier (Spark's Kafka connector), the
container image's build and the development stack (``dev/stack``) all resolve jars here, so the
cache layout has one definition.

Versions live in ``kdelay/jvm/<component>/pom.xml``, package data shipped in the wheel, so an
installed kdelay resolves the same jars as a checkout. Maven copies each component's runtime
jars into ``<cache>/<component>-<version>-<pom digest>/``, so editing a pom re-resolves. A
finished copy is marked with ``.complete`` and is never resolved again: a directory that is
complete needs neither Maven nor the network (the verifier image ships one). The cache is
``$KDELAY_CACHE_DIR``; else ``.cache/jvm`` of the checkout when kdelay runs from one; else
``$XDG_CACHE_HOME/kdelay/jvm`` (``~/.cache/kdelay/jvm``).

Standard library only (and :mod:`kdelay.errors`): the image's jar stage runs
``python -m kdelay.jars`` from these files alone, without installing kdelay's dependencies.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from kdelay.errors import InfrastructureError

COMPONENTS = ("kafka", "zookeeper", "spark-kafka")
MIN_JAVA = 17
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def jvm_dir() -> Path:
    """``kdelay/jvm``, beside this module: the Maven settings and one pom per component."""
    path = Path(__file__).resolve().parent / "jvm"
    if not (path / "settings.xml").is_file():
        raise InfrastructureError(f"{path} holds no pinned JVM build files; reinstall kdelay")
    return path


def pom(component: str) -> Path:
    """``kdelay/jvm/<component>/pom.xml``.

    Only the named component's pom must exist: the image's jar stage copies just the one it
    resolves, so editing another pom does not invalidate that layer.
    """
    if component not in COMPONENTS:
        raise InfrastructureError(f"unknown JVM component {component!r}; known: {COMPONENTS}")
    path = jvm_dir() / component / "pom.xml"
    if not path.is_file():
        raise InfrastructureError(f"{path} is missing; reinstall kdelay")
    return path


def cache_dir() -> Path:
    """Where resolved jars live (see the module's docstring for the order)."""
    env = os.environ.get("KDELAY_CACHE_DIR")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".cache" / "jvm"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kdelay" / "jvm"


@cache
def pinned_version(component: str) -> str:
    """The version pinned in ``kdelay/jvm/<component>/pom.xml``."""
    root = ET.parse(pom(component)).getroot()  # noqa: S314 - our own file
    node = root.find("m:version", _POM_NS)
    if node is None or not node.text:
        raise InfrastructureError(f"kdelay/jvm/{component}/pom.xml has no <version>")
    return node.text.strip()


@cache
def java_executable() -> str:
    """``$JAVA_HOME/bin/java`` or ``java`` on PATH, checked to be Java 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if home and not Path(str(java)).exists():
        raise InfrastructureError(
            f"JAVA_HOME={home} has no bin/java; point it at a Java {MIN_JAVA}+ JDK or unset it"
        )
    if not java or not Path(java).exists():
        raise InfrastructureError(
            f"Java {MIN_JAVA}+ is required but no java was found (install a JDK, e.g. "
            f"'apt-get install openjdk-17-jre-headless', or set JAVA_HOME)"
        )
    out = subprocess.run(
        [java, "-version"], capture_output=True, text=True, check=False, timeout=60
    ).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    if not match:
        raise InfrastructureError(f"cannot read the Java version from {java} -version: {out!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8" style
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise InfrastructureError(
            f"Java {MIN_JAVA}+ is required, {java} is Java {major} (set JAVA_HOME to a newer JDK)"
        )
    return java


def _maven() -> str:
    mvn = shutil.which("mvn")
    if not mvn:
        raise InfrastructureError(
            "Maven is required to fetch the pinned Kafka/ZooKeeper/Spark jars but 'mvn' is not "
            "on PATH (install it, e.g. 'apt-get install maven')"
        )
    return mvn


def jar_dir(component: str, *, progress: bool = False) -> Path:
    """The directory of ``component``'s jars, resolving them on first use."""
    version = pinned_version(component)
    digest = hashlib.sha256(pom(component).read_bytes()).hexdigest()[:10]
    target = cache_dir() / f"{component}-{version}-{digest}"
    if (target / ".complete").exists():
        return target
    java_executable()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    base = jvm_dir()
    cmd = [
        _maven(),
        "-B",
        "-s",
        str(base / "settings.xml"),
        "-f",
        str(pom(component)),
        "package",
        f"-Djars.dir={staging}",
        f"-Dproject.build.directory={staging}.build",
    ]
    if not progress:
        cmd.insert(2, "-q")
    else:
        print(f"==> fetching {component} {version} jars from Maven Central", file=sys.stderr)  # noqa: T201
    result = subprocess.run(
        cmd,
        stdout=None if progress else subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
        timeout=1800,
    )
    shutil.rmtree(f"{staging}.build", ignore_errors=True)
    if result.returncode != 0 or not any(staging.glob("*.jar")):
        detail = (result.stdout or "")[-2000:]
        raise InfrastructureError(
            f"Maven could not resolve {component} {version} (kdelay/jvm/{component}/pom.xml): "
            f"exit {result.returncode}\n{detail}"
        )
    (staging / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def classpath(component: str) -> str:
    """A ``-cp`` value covering every jar of ``component``."""
    return str(jar_dir(component) / "*")


def main(argv: Sequence[str] | None = None) -> None:
    """``kdelay jvm fetch`` and ``python -m kdelay.jars``: resolve the named components (all
    when none is named) and print where each one's jars are."""
    names = list(sys.argv[1:] if argv is None else argv) or list(COMPONENTS)
    for name in names:
        path = jar_dir(name, progress=True)
        print(f"{name} {pinned_version(name)}: {path}")  # noqa: T201 - this is the output


if __name__ == "__main__":  # pragma: no cover - the container image's jar stage runs this
    main()
