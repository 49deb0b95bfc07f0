"""Pinned versions and the jar cache: a second run resolves nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kdelay.errors import InfrastructureError
from kdelay.local import jvm


def test_pinned_versions_come_from_the_committed_poms() -> None:
    assert jvm.pinned_version("kafka").startswith("4.")
    assert jvm.pinned_version("zookeeper").startswith("3.9.")
    assert jvm.pinned_version("spark-kafka") == "4.0.0"


def test_unknown_component_is_named() -> None:
    with pytest.raises(InfrastructureError, match="'flink'"):
        jvm.pinned_version("flink")


def test_a_completed_cache_is_reused_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KDELAY_CACHE_DIR", str(tmp_path))
    first = jvm.jars("zookeeper")  # resolves into tmp_path (or fails loudly without Maven)
    assert (first / ".complete").exists()
    assert any(first.glob("zookeeper-*.jar"))
    # With neither Maven nor Java on PATH, a second call must still succeed from the cache.
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert jvm.jars("zookeeper") == first


def test_missing_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDELAY_CACHE_DIR", str(tmp_path))
    jvm.java_executable()  # cached while java is still on PATH
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(InfrastructureError, match=r"Maven is required.*'mvn' is not on PATH"):
        jvm.jars("kafka")
