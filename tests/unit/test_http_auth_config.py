"""The HTTP API's HTTPS and authentication settings on ProxyConfig: each bad combination is
refused at start with a message naming the settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from kdelay.proxy import ProxyConfig

SASL_UPSTREAM = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}


@pytest.fixture
def pem(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "http.pem", tmp_path / "http.key"
    cert.write_text("cert")
    key.write_text("key")
    return cert, key


def _config(**settings: Any) -> ProxyConfig:
    # A PLAINTEXT Kafka listener before a SASL upstream: opted in (tests/unit/test_secure_defaults).
    return ProxyConfig(
        **{"upstream_config": SASL_UPSTREAM, "listener_allow_unauthenticated": True, **settings}
    )


def _refused(says: str, **settings: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        _config(**settings)
    assert says in str(refused.value)


def test_the_api_is_open_http_by_default() -> None:
    cfg = ProxyConfig()
    assert (cfg.http_auth, cfg.https, cfg.http_sasl_mechanism) == ("none", False, "SCRAM-SHA-512")


def test_kafka_auth_over_https_is_accepted(pem: tuple[Path, Path], tmp_path: Path) -> None:
    jwks = tmp_path / "jwks.json"
    jwks.write_text('{"keys": []}')
    cfg = _config(
        http_auth="KAFKA",
        http_tls_cert=pem[0],
        http_tls_key=pem[1],
        http_sasl_mechanism="plain",
        http_jwks_file=jwks,
    )
    assert (cfg.http_auth, cfg.https, cfg.http_sasl_mechanism) == ("kafka", True, "PLAIN")


def test_kafka_auth_over_plain_http_needs_an_explicit_setting() -> None:
    _refused(
        "set http_tls_cert and http_tls_key (HTTPS), or http_allow_plaintext_auth",
        http_auth="kafka",
    )
    assert _config(http_auth="kafka", http_allow_plaintext_auth=True).https is False


def test_each_bad_setting_is_named(pem: tuple[Path, Path], tmp_path: Path) -> None:
    _refused("http_tls_cert and http_tls_key must be given together", http_tls_cert=pem[0])
    _refused("http_tls_key: no such file", http_tls_cert=pem[0], http_tls_key=tmp_path / "x")
    _refused("http_auth\n  Value error, must be one of none, kafka", http_auth="ldap")
    _refused("must be one of SCRAM-SHA-512, SCRAM-SHA-256, PLAIN", http_sasl_mechanism="GSSAPI")
    _refused("http_jwks_file is used only with http_auth=kafka", http_jwks_file=pem[0])
    with pytest.raises(ValidationError, match="upstream must be SASL_SSL or SASL_PLAINTEXT"):
        ProxyConfig(http_auth="kafka", http_tls_cert=pem[0], http_tls_key=pem[1])
