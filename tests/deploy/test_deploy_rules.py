"""promtool on deploy/prometheus: rules check, rule unit tests, the Compose Prometheus config."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.deploy_tools import (
    ROOT,
    Tools,
    run,
)

PROM = ROOT / "deploy" / "prometheus"


def test_promtool_check_rules(tools: Tools) -> None:
    result = run([tools.promtool, "check", "rules", PROM / "rules.yml"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_fires_in_promtool_unit_tests(tools: Tools) -> None:
    result = run([tools.promtool, "test", "rules", PROM / "rules.test.yml"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_can_fail(tools: Tools, tmp_path: Path) -> None:
    """A wrong expectation is caught: the rule tests really evaluate the expressions."""
    shutil.copy(PROM / "rules.yml", tmp_path / "rules.yml")
    tests = (PROM / "rules.test.yml").read_text()
    assert "16m 40s" in tests
    (tmp_path / "rules.test.yml").write_text(tests.replace("16m 40s", "16m 39s"))
    result = run([tools.promtool, "test", "rules", tmp_path / "rules.test.yml"])
    assert result.returncode != 0
    assert "KdelayCheckpointTooOld" in result.stdout + result.stderr


def test_compose_prometheus_config(tools: Tools, tmp_path: Path) -> None:
    """deploy/prometheus/prometheus.yml with the rule file where Compose mounts it."""
    config = (PROM / "prometheus.yml").read_text()
    assert "/etc/prometheus/rules.yml" in config
    shutil.copy(PROM / "rules.yml", tmp_path / "rules.yml")
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/rules.yml", str(tmp_path / "rules.yml"))
    )
    result = run([tools.promtool, "check", "config", tmp_path / "prometheus.yml"])
    assert result.returncode == 0, result.stdout + result.stderr
