"""``dev.spark.SparkCluster``'s errors name their cause before any process starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dev.spark import SparkCluster, write_state
from kdelay.errors import InfrastructureError
from kdelay.jars import java_executable


def test_a_taken_master_port_is_named_with_its_option(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = SparkCluster(tmp_path, workers=1, port=port)
        with pytest.raises(
            InfrastructureError, match=rf"port {port} on 127.0.0.1 is taken \(--port\)"
        ):
            cluster.start()
    assert cluster.master is None  # nothing was started


def test_no_workers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InfrastructureError, match="--workers must be at least 1"):
        SparkCluster(tmp_path, workers=0)


def test_no_java_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    java_executable.cache_clear()  # another test may have found the real one
    try:
        with pytest.raises(InfrastructureError, match=r"JAVA_HOME=.* has no bin/java"):
            SparkCluster(tmp_path, workers=1).start()
    finally:
        java_executable.cache_clear()


def test_the_state_file_is_written_whole_and_world_readable(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "spark.json"
    write_state(path, {"spark_master": "spark://127.0.0.1:1", "spark_ui": "", "workers": []})
    assert path.stat().st_mode & 0o777 == 0o644
    assert '"spark_master": "spark://127.0.0.1:1"' in path.read_text()
    assert [p.name for p in path.parent.iterdir()] == ["spark.json"]
