"""Pinned versions and the jar cache (kdelay/jars.py): a second run resolves nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kdelay import jars
from kdelay.errors import InfrastructureError


def test_pinned_versions_come_from_the_committed_poms() -> None:
    assert jars.pinned_version("kafka").startswith("4.")
    assert jars.pinned_version("zookeeper").startswith("3.9.")
    assert jars.pinned_version("spark-kafka") == "4.0.0"


def test_unknown_component_is_named() -> None:
    with pytest.raises(InfrastructureError, match="'flink'"):
        jars.pinned_version("flink")


def test_a_completed_cache_is_reused_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KDELAY_CACHE_DIR", str(tmp_path))
    first = jars.jar_dir("zookeeper")  # resolves into tmp_path (or fails loudly without Maven)
    assert (first / ".complete").exists()
    assert any(first.glob("zookeeper-*.jar"))
    # With neither Maven nor Java on PATH, a second call must still succeed from the cache.
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert jars.jar_dir("zookeeper") == first


def test_missing_maven_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDELAY_CACHE_DIR", str(tmp_path))
    jars.java_executable()  # cached while java is still on PATH
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(InfrastructureError, match=r"Maven is required.*'mvn' is not on PATH"):
        jars.jar_dir("kafka")


def _fake_java(tmp_path: Path, version_line: str) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return home


@pytest.fixture
def fresh_java_lookup() -> Iterator[None]:
    """java_executable() is cached per process; these tests need it to look again, and the
    tests after them need it to forget the fake."""
    jars.java_executable.cache_clear()
    yield
    jars.java_executable.cache_clear()


@pytest.mark.usefixtures("fresh_java_lookup")
def test_an_old_java_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "JAVA_HOME", str(_fake_java(tmp_path, 'openjdk version "11.0.22" 2024-01-16'))
    )
    with pytest.raises(InfrastructureError, match=r"Java 17\+ is required, .* is Java 11"):
        jars.java_executable()


@pytest.mark.usefixtures("fresh_java_lookup")
def test_java_8_version_strings_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(_fake_java(tmp_path, 'java version "1.8.0_392"')))
    with pytest.raises(InfrastructureError, match="is Java 8 "):
        jars.java_executable()


@pytest.mark.usefixtures("fresh_java_lookup")
def test_missing_java_names_java_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
    with pytest.raises(InfrastructureError, match=r"JAVA_HOME=.*no-such-jdk has no bin/java"):
        jars.java_executable()
