"""Every image kdelay's containers use, and how ``make containers`` builds each one locally.

No image is pulled from a registry. The chain, each built only when its inputs changed:

- ``debian``: Debian bookworm minbase by debootstrap (:mod:`dev.containers.rootfs`);
- ``python``, ``java``: Debian's Python 3.11 / OpenJDK 17 on it (dev/images/base/Dockerfile);
- ``kafka``, ``zookeeper``: the jars kdelay pins (kdelay/jvm, :mod:`kdelay.jars`) on ``java``
  (dev/images/kafka, dev/images/zookeeper);
- ``prometheus``: Debian's package on ``debian`` (dev/images/prometheus);
- ``kdelay``, ``verifier``: deploy/docker/Dockerfile's ``runtime`` and ``verifier`` targets on
  ``python`` (pip reaches PyPI, the verifier's jar stage Maven Central, during the build);
- ``grafana``: never built (no Grafana binary is reachable here); the official image.

Each image's name comes from a variable (``KDELAY_KAFKA_IMAGE``, ...) with the local build as
default. Naming another image there (``apache/kafka:4.3.1``, ``python:3.11-slim-bookworm``) uses
it instead: it is not built, and the engine pulls it when first used. An image built here carries
the label ``io.kdelay.inputs``: the digest of its Dockerfile, build context, build arguments and
the id of the image it starts from. When the image exists with the same digest it is up to date.

Build contexts are staged under ``.cache/containers/context/<image>``: the jars for Kafka and
ZooKeeper, and for the kdelay images exactly the sources deploy/docker/Dockerfile copies (its
``COPY`` lines), so the build reads the same context with podman, or Docker with or without
BuildKit, and never walks the repository (``.venv``, ``.cache``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dev import ROOT
from dev.containers import rootfs
from dev.containers.engine import Engine, cache_dir, state_dir
from kdelay import __version__, jars
from kdelay.errors import InfrastructureError

INPUTS_LABEL = rootfs.INPUTS_LABEL
DOCKER = Path("deploy") / "docker"
IMAGES = Path("dev") / "images"  # the locally built infrastructure images


@dataclass(frozen=True)
class Image:
    """One image: its variable, its default (local) name, and what it is."""

    key: str
    variable: str
    default: str
    what: str
    #: The image this one starts from (a key), and the build argument that names it.
    parent: str | None = None
    parent_arg: str = ""
    buildable: bool = True

    @property
    def name(self) -> str:
        """The image used: ``$<variable>`` when set, else the local build."""
        return os.environ.get(self.variable) or self.default

    @property
    def local(self) -> bool:
        """Whether ``make containers`` builds it (its variable names no other image)."""
        return self.buildable and self.name == self.default


def catalogue() -> dict[str, Image]:
    """Every image, in build order."""
    kafka, zookeeper = jars.pinned_version("kafka"), jars.pinned_version("zookeeper")
    version = __version__.split("+")[0]
    images = [
        Image("debian", "KDELAY_DEBIAN_IMAGE", f"kdelay/debian:{rootfs.SUITE}",
              "Debian minbase (debootstrap)"),
        Image("python", "KDELAY_PYTHON_IMAGE", "kdelay/python:3.11-bookworm",
              "Debian's Python 3.11", "debian", "DEBIAN_IMAGE"),
        Image("java", "KDELAY_JAVA_IMAGE", "kdelay/java:17-bookworm",
              "Debian's OpenJDK 17 JRE", "debian", "DEBIAN_IMAGE"),
        Image("kafka", "KDELAY_KAFKA_IMAGE", f"kdelay/kafka:{kafka}",
              f"Kafka {kafka} (KRaft) from the pinned jars", "java", "JAVA_IMAGE"),
        Image("zookeeper", "KDELAY_ZOOKEEPER_IMAGE", f"kdelay/zookeeper:{zookeeper}",
              f"ZooKeeper {zookeeper} from the pinned jars", "java", "JAVA_IMAGE"),
        Image("prometheus", "KDELAY_PROMETHEUS_IMAGE", f"kdelay/prometheus:{rootfs.SUITE}",
              "Prometheus, Debian's package", "debian", "DEBIAN_IMAGE"),
        Image("kdelay", "KDELAY_IMAGE", f"kdelay/kdelay:{version}",
              "kdelay runtime (proxy, delay-service, status)", "python", "PYTHON_IMAGE"),
        Image("verifier", "KDELAY_VERIFIER_IMAGE", f"kdelay/kdelay-verifier:{version}",
              "kdelay verifier (Spark, Java 17)", "python", "PYTHON_IMAGE"),
        Image("grafana", "KDELAY_GRAFANA_IMAGE", "grafana/grafana:11.6.0",
              "Grafana (official image; no binary reachable here)", buildable=False),
    ]  # fmt: skip
    return {i.key: i for i in images}


def names() -> dict[str, str]:
    """``KDELAY_*_IMAGE`` -> the image used, for compose and the tests."""
    return {i.variable: i.name for i in catalogue().values()}


@dataclass(frozen=True)
class Recipe:
    """How one image is built: Dockerfile, target, build arguments and staged context."""

    dockerfile: Path
    target: str | None = None
    args: dict[str, str] = field(default_factory=dict)
    stage: Callable[[Path], None] | None = None  # fills the context directory


def _root() -> Path:
    return ROOT


def _copy(
    src: Path, dst: Path, *, skip: Callable[[Path], bool] = lambda _p: False, link: bool = False
) -> None:
    """Copy a file or a tree, leaving out what ``skip`` says; ``link``: hard-link files where
    possible (the jar cache's files, which are never written again)."""
    if skip(src):
        return
    if src.is_symlink() and not dst.exists():  # kdelay/proxy -> ../proxy: a link, as git keeps it
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.symlink_to(src.readlink())
        return
    if src.is_dir():
        dst.mkdir(parents=True, exist_ok=True)
        for child in sorted(src.iterdir()):
            _copy(child, dst / child.name, skip=skip, link=link)
        return
    if dst.exists():  # named twice (a directory and a file in it)
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(src, dst)
        except OSError:
            pass
        else:
            return
    shutil.copy2(src, dst)


def _stage_jvm(component: str, libs: str) -> Callable[[Path], None]:
    def stage(context: Path) -> None:
        for jar in sorted(jars.jar_dir(component, progress=True).glob("*.jar")):
            _copy(jar, context / libs / jar.name, link=True)
        src = _root() / IMAGES / component
        for child in sorted(src.iterdir()):
            if child.name != "Dockerfile":
                _copy(child, context / child.name)

    return stage


def dockerfile_sources(dockerfile: Path) -> list[str]:
    """The build-context paths a Dockerfile's ``COPY``/``ADD`` lines read (not ``--from``)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    found: list[str] = []
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3 or words[0].upper() not in ("COPY", "ADD"):
            continue
        if any(w.startswith("--from=") for w in words):
            continue
        found += [w for w in words[1:-1] if not w.startswith("--")]
    return list(dict.fromkeys(found))


def _ignore_patterns(dockerfile: Path) -> list[str]:
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    if not ignore.exists():
        return []
    return [
        p.strip()
        for p in ignore.read_text().splitlines()
        if p.strip() and not p.startswith("#") and not p.startswith("!") and p.strip() != "*"
    ]


def _stage_sources(dockerfile: Path) -> Callable[[Path], None]:
    """Stage exactly what the Dockerfile copies, minus its .dockerignore's exclusions."""

    def stage(context: Path) -> None:
        root = _root()
        patterns = [p.removeprefix("**/").rstrip("/") for p in _ignore_patterns(dockerfile)]

        def skip(path: Path) -> bool:
            rel = path.relative_to(root).as_posix()
            return any(fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(rel, p) for p in patterns)

        for source in dockerfile_sources(dockerfile):
            for path in sorted(root.glob(source)):
                _copy(path, context / path.relative_to(root), skip=skip)

    return stage


def recipes() -> dict[str, Recipe]:
    root = _root()
    base = IMAGES / "base" / "Dockerfile"
    main = DOCKER / "Dockerfile"
    return {
        "python": Recipe(base, "python"),
        "java": Recipe(base, "java"),
        "kafka": Recipe(
            IMAGES / "kafka" / "Dockerfile",
            args={"KAFKA_VERSION": jars.pinned_version("kafka")},
            stage=_stage_jvm("kafka", "libs"),
        ),
        "zookeeper": Recipe(
            IMAGES / "zookeeper" / "Dockerfile",
            args={"ZOOKEEPER_VERSION": jars.pinned_version("zookeeper")},
            stage=_stage_jvm("zookeeper", "lib"),
        ),
        "prometheus": Recipe(IMAGES / "prometheus" / "Dockerfile"),
        "kdelay": Recipe(main, "runtime", stage=_stage_sources(root / main)),
        "verifier": Recipe(main, "verifier", stage=_stage_sources(root / main)),
    }


def _tree_digest(top: Path) -> bytes:
    """The digest of every file under ``top``: relative path and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in top.rglob("*") if p.is_file()):
        digest.update(path.relative_to(top).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.digest()


def image_id(engine: Engine, name: str) -> str | None:
    result = engine.run("image", "inspect", "--format", "{{.Id}}", name, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


@dataclass
class Plan:
    """One image's build, prepared: its staged context and inputs digest."""

    image: Image
    recipe: Recipe
    context: Path
    build_args: dict[str, str]
    digest: str


def plan(engine: Engine, image: Image, recipe: Recipe, parent: Image | None) -> Plan:
    """Stage ``image``'s context and digest its inputs (the parent must exist by now)."""
    root = _root()
    context = cache_dir() / "context" / image.key
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    if recipe.stage is not None:
        recipe.stage(context)
    build_args = dict(recipe.args)
    digest = hashlib.sha256()
    digest.update(f"{recipe.dockerfile}|{recipe.target}".encode())
    digest.update((root / recipe.dockerfile).read_bytes())
    if parent is not None:
        parent_id = image_id(engine, parent.name)
        if parent.local and parent_id is None:
            raise InfrastructureError(f"{parent.name} (the base of {image.name}) is not built")
        build_args[image.parent_arg] = parent.name
        digest.update(f"{parent.name}@{parent_id}".encode())
    for key, value in sorted(build_args.items()):
        digest.update(f"{key}={value}\0".encode())
    digest.update(_tree_digest(context))
    return Plan(image, recipe, context, build_args, digest.hexdigest()[:16])


#: Build-output lines shown as progress (podman, Docker's legacy builder, BuildKit).
_PROGRESS = re.compile(r"^(\[\d+/\d+\] )?(STEP \d+/\d+|Step \d+/\d+|#\d+ \[)")


def build(engine: Engine, p: Plan, log: Path, show: Callable[[str], None]) -> None:
    """Build ``p`` into the engine, its output in ``log`` and its steps shown."""
    root = _root()
    argv = [*engine.cli, "build", "-f", str(root / p.recipe.dockerfile), "-t", p.image.name]
    argv += ["--label", f"{INPUTS_LABEL}={p.digest}"]
    if p.recipe.target:
        argv += ["--target", p.recipe.target]
    for key, value in sorted(p.build_args.items()):
        argv += ["--build-arg", f"{key}={value}"]
    argv.append(str(p.context))
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(
            argv,
            env=engine.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if _PROGRESS.match(line):
                show(line.rstrip()[:110])
        code = proc.wait()
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise InfrastructureError(f"building {p.image.name} failed ({code}); log {log}:\n{tail}")


def logs_dir() -> Path:
    return state_dir() / "logs"


def selected(keys: Iterable[str] | None) -> list[Image]:
    """The images to build (``keys``, or all), with the local bases they need, in order."""
    cat = catalogue()
    wanted = set(keys) if keys else set(cat)
    unknown = wanted - set(cat)
    if unknown:
        raise InfrastructureError(f"unknown image(s) {sorted(unknown)}; known: {list(cat)}")
    closure = set(wanted)
    for key in list(wanted):
        parent = cat[key].parent
        while parent is not None and cat[parent].local:
            closure.add(parent)
            parent = cat[parent].parent
    return [i for k, i in cat.items() if k in closure]
