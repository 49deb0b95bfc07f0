"""Verifier config, charts, metrics, sinks and CLI checks that need no Spark."""

from __future__ import annotations

import builtins
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kdelay.config_loader import load
from kdelay.durations import duration_ms
from kdelay.errors import ConfigError
from kdelay.verifier import chart
from kdelay.verifier.cli import command
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.metrics import Metrics
from kdelay.verifier.report import Lateness, Summary, WindowResult
from kdelay.verifier.sinks import Sinks

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[2]


def _windows() -> list[WindowResult]:
    return [
        WindowResult(1_700_000_000_000 + i * 10_000, 1_700_000_010_000 + i * 10_000, s)
        for i, s in enumerate(
            [
                Summary(5, 5, 0, 0, 0, Lateness(3.0, 8.0, 9.0, 10.0)),
                Summary(4, 3, 1, 1, 0, Lateness(4.0, 12.0, 15.0, 16.0)),
                Summary(1, 0, 1, 0, 0),
            ]
        )
    ]


def test_durations_parse_to_milliseconds() -> None:
    assert [duration_ms(t) for t in ("250", "250ms", "10s", "2m", "1h")] == [
        250,
        250,
        10_000,
        120_000,
        3_600_000,
    ]
    with pytest.raises(ValueError, match="not a duration"):
        duration_ms("ten seconds")


def test_config_layers_and_names_a_bad_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "verifier.yaml"
    file.write_text("grace-ms: 5000\nwindow: 1m\ntopics: a, b\n")
    monkeypatch.setenv("KDELAY_VERIFIER_GRACE_MS", "7000")
    cfg = load(VerifierConfig, {"window": None, "output_topic": ""}, file)
    assert (cfg.grace_ms, cfg.window_ms, cfg.topic_list, cfg.output_topic) == (
        7000,
        60_000,
        ["a", "b"],
        "",
    )
    with pytest.raises(ConfigError, match="window"):
        load(VerifierConfig, {"window": "soon"})
    assert cfg.isolation_level == "read_committed"
    with pytest.raises(ConfigError, match="isolation_level"):
        load(VerifierConfig, {"isolation_level": "serializable"})


def test_the_isolation_level_is_a_flag() -> None:
    result = CliRunner().invoke(command, ["--help"])
    assert result.exit_code == 0
    assert "--isolation-level" in result.output


def test_charts_are_png_files_next_to_the_report(tmp_path: Path) -> None:
    report = tmp_path / "run" / "report.json"
    report.parent.mkdir()
    points = [(1_700_000_000_000 + x * 40, float(x % 37)) for x in range(500)]
    paths = chart.write_charts(_windows(), points, report)
    assert [p.name for p in paths] == ["report.lateness.png", "report.histogram.png"]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG_SIGNATURE)
        assert len(data) > 5_000
    empty = chart.write_charts([], [], tmp_path / "empty.json")
    assert all(p.read_bytes().startswith(PNG_SIGNATURE) for p in empty)


def _documented_verifier_metrics() -> set[str]:
    text = (ROOT / "docs" / "metrics.md").read_text()
    return set(re.findall(r"`(kdelay_verifier_[a-z_]+)`", text))


def test_metric_names_are_the_documented_ones() -> None:
    metrics = Metrics()
    metrics.record([w.summary for w in _windows()], [1.0, 20.0, 3000.0])
    names = {s.name for fam in metrics.registry.collect() for s in fam.samples}
    documented = _documented_verifier_metrics()
    assert documented, "docs/metrics.md lists no verifier metric"
    for name in documented:
        wanted = f"{name}_count" if name.endswith("_seconds") else name
        assert wanted in names, f"{name} is documented but not exported"
    value = metrics.registry.get_sample_value
    assert value("kdelay_verifier_scheduled_total") == 10
    assert value("kdelay_verifier_missing_total") == 2
    assert value("kdelay_verifier_duplicates_total") == 1
    assert value("kdelay_verifier_lateness_seconds_count") == 3
    assert value("kdelay_verifier_lateness_seconds_bucket", {"le": "0.025"}) == 2


def test_sinks_write_one_json_file_per_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = VerifierConfig(output_dir=tmp_path, output_topic="", console=True)
    sinks = Sinks(cfg)
    sinks.publish("batch-000003", _windows(), [])
    sinks.close()
    written = json.loads((tmp_path / "windows" / "batch-000003.json").read_text())
    assert [w["window_start_ms"] for w in written] == [w.start_ms for w in _windows()]
    assert written[1]["missing"] == 1
    assert written[1]["lateness_ms"]["p99"] == 15.0
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line)["batch"] for line in lines] == ["batch-000003"] * 3


def test_report_without_once_is_a_usage_error_before_spark_starts(tmp_path: Path) -> None:
    result = CliRunner().invoke(command, ["--report", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "--report needs --once" in result.output


def test_verify_without_pyspark_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_pyspark(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name="pyspark")
        return real_import(name, *args, **kwargs)

    # As in a full run, where other tests imported the job already: `from kdelay.verifier import
    # job` would find the package attribute and never import, so both are removed.
    import kdelay.verifier
    import kdelay.verifier.job

    monkeypatch.delitem(sys.modules, "kdelay.verifier.job")
    monkeypatch.delattr(kdelay.verifier, "job")
    monkeypatch.setattr(builtins, "__import__", no_pyspark)
    result = CliRunner().invoke(command, ["--once", "--bootstrap-servers", "127.0.0.1:1"])
    assert result.exit_code != 0
    assert "pip install 'kdelay[verifier]'" in result.output
