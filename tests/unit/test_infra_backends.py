"""Backend selection for the test infrastructure: explicit, and never a silent pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import infra


def test_auto_picks_local_without_a_docker_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDELAY_TEST_INFRA", "auto")
    monkeypatch.setattr(infra, "docker_available", lambda: False)
    assert infra.backend() == "local"
    monkeypatch.setattr(infra, "docker_available", lambda: True)
    assert infra.backend() == "testcontainers"


def test_unknown_backend_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDELAY_TEST_INFRA", "kubernetes")
    with pytest.raises(pytest.UsageError, match="'kubernetes'"):
        infra.backend()


def test_testcontainers_without_docker_skips_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KDELAY_TEST_INFRA", "testcontainers")
    monkeypatch.setattr(infra, "docker_available", lambda: False)
    with (
        pytest.raises(pytest.skip.Exception, match="no Docker engine answers"),
        infra.kafka(tmp_path),
    ):
        pass
    with (
        pytest.raises(pytest.skip.Exception, match="no Docker engine answers"),
        infra.zookeeper(tmp_path),
    ):
        pass


def test_external_without_addresses_skips_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KDELAY_TEST_INFRA", "external")
    monkeypatch.delenv("KDELAY_TEST_BOOTSTRAP", raising=False)
    with pytest.raises(pytest.skip.Exception, match="KDELAY_TEST_BOOTSTRAP"), infra.kafka(tmp_path):
        pass


def test_external_uses_the_named_servers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KDELAY_TEST_INFRA", "external")
    monkeypatch.setenv("KDELAY_TEST_BOOTSTRAP", "127.0.0.1:19092")
    monkeypatch.setenv("KDELAY_TEST_ZK", "127.0.0.1:12181")
    with infra.kafka(tmp_path) as kafka:
        assert kafka.bootstrap_servers == "127.0.0.1:19092"
        assert kafka.local is None
    with infra.zookeeper(tmp_path) as zk:
        assert zk.connect == "127.0.0.1:12181"
