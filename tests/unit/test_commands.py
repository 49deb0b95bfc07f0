from __future__ import annotations

from importlib.metadata import version

import pytest
from click.testing import CliRunner

from kdelay import __version__
from kdelay.commands import SUBCOMMANDS, cli


def test_version_is_the_package_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"kdelay, version {__version__}"
    assert __version__ == version("kdelay")  # the installed distribution's, not a literal


def test_unknown_subcommand_names_itself() -> None:
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2
    assert "frobnicate" in result.output


def test_a_component_missing_from_the_installation_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(SUBCOMMANDS, "ghost", "no_such_component.cli:command")
    result = CliRunner().invoke(cli, ["ghost"])
    assert result.exit_code == 2
    assert "no module no_such_component" in result.output
    assert "no_such_component.cli:command" in result.output


def test_send_replace_needs_an_id_and_a_timing_option() -> None:
    for args in (["--delay", "1s"], ["--id", "x"]):
        result = CliRunner().invoke(
            cli,
            ["send", "--bootstrap-servers", "127.0.0.1:1", "--topic", "t", "--replace", *args, "v"],
        )
        assert result.exit_code == 2
        assert "--replace needs --id and one of --delay, --at, --level" in result.output
