"""Click options generated from a settings model (kdelay/options.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner
from pydantic import Field
from pydantic_settings import BaseSettings

from kdelay.config_loader import component_config, load
from kdelay.options import config_options, unflagged


class Demo(BaseSettings):
    model_config = component_config("KDELAY_DEMO_")

    buffer_topic: str = Field(default="__buf", description="the buffer topic")
    scan_batch: int = Field(default=10, ge=1, description="entries per round")
    timeout_s: float = 1.5
    data_dir: Path = Path("data")
    port: int | None = None
    ensure_topics: bool = True
    extra: dict[str, str] = Field(default_factory=dict)
    levels: tuple[int, ...] = (1, 2)


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[Demo | None, click.testing.Result]:
    seen: list[Demo] = []

    @click.command()
    @config_options(Demo)
    def cmd(**flags: Any) -> None:
        seen.append(load(Demo, flags))

    result = CliRunner().invoke(cmd, list(args), env=env)
    return (seen[0] if seen else None), result


def test_every_scalar_setting_gets_a_flag_with_its_type() -> None:
    cfg, result = _run(
        "--buffer-topic", "t", "--scan-batch", "7", "--timeout-s", "2.5",
        "--data-dir", "/tmp/x", "--port", "9", "--no-ensure-topics",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert cfg is not None
    assert cfg.buffer_topic == "t"
    assert cfg.scan_batch == 7
    assert cfg.timeout_s == 2.5
    assert cfg.data_dir == Path("/tmp/x")
    assert cfg.port == 9
    assert cfg.ensure_topics is False


def test_unset_flags_leave_environment_and_defaults_in_force() -> None:
    cfg, result = _run(env={"KDELAY_DEMO_SCAN_BATCH": "42"})
    assert result.exit_code == 0, result.output
    assert cfg is not None
    assert cfg.scan_batch == 42  # from the environment: the flag was not given
    assert cfg.buffer_topic == "__buf"
    assert cfg.ensure_topics is True


def test_help_shows_description_and_default_in_model_order() -> None:
    _, result = _run("--help")
    text = result.output
    assert "the buffer topic [__buf]" in text
    assert "entries per round [10]" in text
    assert text.index("--buffer-topic") < text.index("--scan-batch") < text.index("--port")


def test_mappings_and_tuples_have_no_flag() -> None:
    assert unflagged(Demo) == ["extra", "levels"]
    _, result = _run("--extra", "a")
    assert result.exit_code == 2
    assert "No such option '--extra'" in result.output


def test_a_bad_value_is_named_by_the_model() -> None:
    _, result = _run("--scan-batch", "0")
    assert result.exit_code != 0
    assert "scan_batch" in str(result.exception)
