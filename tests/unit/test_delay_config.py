"""Replica configuration: defaults, precedence, and errors that name the bad setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from kdelay.config_loader import load
from kdelay.delay_service.cli import command
from kdelay.delay_service.config import ReplicaConfig
from kdelay.errors import ConfigError


def test_defaults_and_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg_file = tmp_path / "replica.yaml"
    cfg_file.write_text("name: from-file\ncheckpoint-interval-ms: 50\ndead_letter_after: 7\n")
    monkeypatch.setenv("KDELAY_REPLICA_DEAD_LETTER_AFTER", "9")
    cfg = load(ReplicaConfig, {"name": "from-flag", "metrics_port": None}, cfg_file)
    assert (cfg.name, cfg.checkpoint_interval_ms, cfg.dead_letter_after) == ("from-flag", 50, 9)
    assert cfg.zk_root == "/kdelay/default"
    assert cfg.metrics_port == 0
    with pytest.raises(ValidationError, match="frozen"):
        cfg.name = "x"


@pytest.mark.parametrize(
    ("flags", "setting"),
    [
        (["--metrics-port", "70000"], "metrics_port"),
        (["--checkpoint-interval-ms", "0"], "checkpoint_interval_ms"),
        (["--zk-root", "relative/path"], "zk_root"),
        (["--name", "a/b"], "name"),
        (["--dead-letter-after", "0"], "dead_letter_after"),
    ],
)
def test_invalid_settings_are_named(flags: list[str], setting: str) -> None:
    result = CliRunner().invoke(command, flags)
    assert isinstance(result.exception, ConfigError)
    assert setting in str(result.exception)
