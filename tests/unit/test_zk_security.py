"""ZooKeeper security settings (zk/security.py): the kazoo arguments they make, the errors
that name the setting, and every kazoo client of kdelay's built with them."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, cast

import click
import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.protocol.serialization import Auth
from kazoo.security import Permissions, make_digest_acl
from pydantic import SecretStr, ValidationError

from kdelay.config_loader import load
from kdelay.delay_service.cli import status_command
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.reshard.cli import reshard_command
from kdelay.delay_service.zk_flags import zk_security
from kdelay.errors import ConfigError
from kdelay.proxy.config import ProxyConfig
from kdelay.zk import Session
from kdelay.zk.replica_api import ReplicaApi
from kdelay.zk.security import ZkSecurity

#: Random, so a leak check cannot pass by chance.
PASSWORD = secrets.token_urlsafe(16)


def test_open_and_plaintext_by_default() -> None:
    sec = ZkSecurity()
    assert sec.kazoo_kwargs() == {}
    assert sec.zk_acl() is None


def test_digest_login_and_acl() -> None:
    kwargs = ZkSecurity(
        zk_auth_username="kdelay", zk_auth_password=SecretStr(PASSWORD)
    ).kazoo_kwargs()
    assert kwargs["auth_data"] == [("digest", f"kdelay:{PASSWORD}")]
    [acl] = kwargs["default_acl"]
    assert acl == make_digest_acl("kdelay", PASSWORD, all=True)
    assert (acl.id.scheme, acl.perms) == ("digest", Permissions.ALL)
    assert acl.id.id.startswith("kdelay:")
    assert PASSWORD not in acl.id.id  # a hash, not the secret
    assert set(kwargs) == {"auth_data", "default_acl"}


def test_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "zk-password"
    secret.write_text(PASSWORD + "\n")
    sec = ZkSecurity(zk_auth_username="kdelay", zk_auth_password_file=secret)
    assert sec.kazoo_kwargs()["auth_data"] == [("digest", f"kdelay:{PASSWORD}")]


def test_tls_verifies_the_certificate_and_host(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    assert ZkSecurity(zk_tls=True, zk_tls_ca_file=ca).kazoo_kwargs() == {
        "use_ssl": True,
        "verify_certs": True,
        "check_hostname": True,
        "ca": str(ca),
    }
    assert "ca" not in ZkSecurity(zk_tls=True).kazoo_kwargs()  # the system's CAs


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"zk_auth_username": "kdelay"}, "zk_auth_username needs zk_auth_password"),
        ({"zk_auth_password": PASSWORD}, "without zk_auth_username"),
        ({"zk_auth_username": "a:b", "zk_auth_password": PASSWORD}, "contain no ':'"),
        ({"zk_auth_username": "kdelay", "zk_auth_password": ""}, "zk_auth_password is empty"),
        ({"zk_tls_ca_file": "ca.pem"}, "zk_tls_ca_file is set but zk_tls is off"),
        ({"zk_tls": True, "zk_tls_ca_file": "/nonexistent/ca.pem"}, "zk_tls_ca_file: cannot read"),
        (
            {"zk_auth_username": "k", "zk_auth_password_file": "/nonexistent/pw"},
            "zk_auth_password_file: cannot read",
        ),
    ],
)
def test_errors_name_the_setting_never_the_password(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ZkSecurity(**settings)
    # What kdelay shows is each error's message (kdelay/config_loader.py, the CLI's usage error).
    shown = "; ".join(str(e["msg"]) for e in caught.value.errors())
    assert message in shown
    assert PASSWORD not in shown


def test_a_replica_configuration_error_shows_no_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDELAY_REPLICA_ZK_AUTH_PASSWORD", PASSWORD)
    with pytest.raises(ConfigError, match="without zk_auth_username") as caught:
        load(ReplicaConfig, {}, None)
    assert PASSWORD not in str(caught.value)


def test_password_and_file_both_refused(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD)
    with pytest.raises(ValidationError, match="not both"):
        ZkSecurity(
            zk_auth_username="k", zk_auth_password=SecretStr(PASSWORD), zk_auth_password_file=secret
        )


def test_empty_password_file_refused(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("\n")
    with pytest.raises(ValidationError, match=r"zk_auth_password_file: .* is empty"):
        ZkSecurity(zk_auth_username="k", zk_auth_password_file=secret)


def test_component_configs_read_the_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KDELAY_REPLICA_ZK_AUTH_USERNAME", "kdelay")
    monkeypatch.setenv("KDELAY_REPLICA_ZK_AUTH_PASSWORD", PASSWORD)
    monkeypatch.setenv("KDELAY_PROXY_ZK_AUTH_USERNAME", "kdelay")
    monkeypatch.setenv("KDELAY_PROXY_ZK_AUTH_PASSWORD", PASSWORD)
    for cfg in (ReplicaConfig(), ProxyConfig()):
        assert cfg.kazoo_kwargs()["auth_data"] == [("digest", f"kdelay:{PASSWORD}")]
        assert PASSWORD not in repr(cfg)
        assert PASSWORD not in str(cfg)


def test_user_from_a_flag_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The documented way: the user a flag, the password a Secret in the environment (the
    settings are checked together, not the environment's alone: kdelay/config_loader.py)."""
    monkeypatch.setenv("KDELAY_REPLICA_ZK_AUTH_PASSWORD", PASSWORD)
    cfg = load(ReplicaConfig, {"zk_auth_username": "kdelay"}, None)
    assert cfg.zk_password() == PASSWORD
    # And the other way round: the user in the environment, the password file a flag.
    monkeypatch.delenv("KDELAY_REPLICA_ZK_AUTH_PASSWORD")
    monkeypatch.setenv("KDELAY_REPLICA_ZK_AUTH_USERNAME", "kdelay")
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD)
    cfg = load(ReplicaConfig, {"zk_auth_password_file": secret}, None)
    assert cfg.kazoo_kwargs()["auth_data"] == [("digest", f"kdelay:{PASSWORD}")]


def test_kazoo_debug_log_of_the_login_hides_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ZkSecurity(zk_auth_username="kdelay", zk_auth_password=SecretStr(PASSWORD)).kazoo_kwargs()
    kazoo_log = logging.getLogger("kazoo.client")
    with caplog.at_level(logging.DEBUG, logger="kazoo.client"):
        # What kazoo's connection logs when it sends the login (kazoo/protocol/connection.py).
        kazoo_log.debug("Sending request(xid=%s): %s", -4, Auth(0, "digest", f"kdelay:{PASSWORD}"))
    assert "Auth(scheme='digest', auth=<hidden>)" in caplog.text
    assert PASSWORD not in caplog.text


class _RecordingKazoo:
    """Stands in for KazooClient: records its arguments, starts nothing."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.made.append(kwargs)

    def start(self, timeout: float) -> None:
        raise OSError("not started in a unit test")


def test_every_kazoo_client_gets_the_settings() -> None:
    sec = ZkSecurity(zk_auth_username="kdelay", zk_auth_password=SecretStr(PASSWORD))
    session = Session("127.0.0.1:1", 2.0, security=sec)
    assert set(session.client.auth_data) == {("digest", f"kdelay:{PASSWORD}")}
    assert session.client.default_acl == sec.zk_acl()
    plain = Session("127.0.0.1:1", 2.0)
    assert (plain.client.default_acl, plain.client.use_ssl) == (None, False)

    _RecordingKazoo.made.clear()
    factory = cast("Callable[..., KazooClient]", _RecordingKazoo)
    api = ReplicaApi("127.0.0.1:1", security=sec, client_factory=factory)
    with pytest.raises(OSError, match="not started"):
        api.shards()  # connects first
    [made] = _RecordingKazoo.made
    assert made["auth_data"] == [("digest", f"kdelay:{PASSWORD}")]
    assert made["default_acl"] == sec.zk_acl()


def test_cli_password_from_the_environment_never_a_flag(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("KDELAY_REPLICA_ZK_AUTH_PASSWORD", raising=False)
    monkeypatch.setenv("KDELAY_ZK_AUTH_PASSWORD", PASSWORD)
    sec = zk_security("kdelay", None, False, None)
    assert sec.zk_password() == PASSWORD
    # The replicas' variable serves when the CLI's own is not set.
    monkeypatch.delenv("KDELAY_ZK_AUTH_PASSWORD")
    monkeypatch.setenv("KDELAY_REPLICA_ZK_AUTH_PASSWORD", "replica-" + PASSWORD)
    assert zk_security("kdelay", None, False, None).zk_password() == "replica-" + PASSWORD
    for command in (status_command, reshard_command):
        help_text = CliRunner().invoke(command, ["--help"]).output
        assert "--zk-auth-username" in help_text
        assert "--zk-auth-password-file" in help_text
        assert "--zk-auth-password " not in help_text


def test_cli_errors_name_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KDELAY_ZK_AUTH_PASSWORD", raising=False)
    monkeypatch.delenv("KDELAY_REPLICA_ZK_AUTH_PASSWORD", raising=False)
    with pytest.raises(click.UsageError, match="zk_auth_username needs zk_auth_password"):
        zk_security("kdelay", None, False, None)
    result = CliRunner().invoke(status_command, ["--zk-auth-username", "kdelay"])
    assert result.exit_code == 2
    assert "ZooKeeper security: zk_auth_username needs" in result.output
