"""Secure by default: a proxy whose Kafka listener requires SASL does not
start with an open HTTP API, nor a listener without SASL in front of a SASL upstream, unless
the opt-in naming the risk is set."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from kdelay.proxy import ProxyConfig
from kdelay.proxy.secure_defaults import refusal

UPSTREAM = {
    "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "kdelay",
    "sasl.password": "pw",
}


def _config(**settings: Any) -> ProxyConfig:
    return ProxyConfig(**{"upstream_config": UPSTREAM, **settings})


def _refused(setting: str, **settings: Any) -> str:
    with pytest.raises(ValidationError) as refused:
        _config(**settings)
    message = str(refused.value)
    assert setting in message
    return message


def test_a_sasl_listener_with_an_open_http_api_is_refused_naming_the_opt_in() -> None:
    message = _refused("http_allow_unauthenticated", listener_security_protocol="SASL_PLAINTEXT")
    assert "http_auth=kafka" in message


def test_the_open_http_api_starts_when_opted_in_or_authenticated() -> None:
    opted = _config(listener_security_protocol="SASL_PLAINTEXT", http_allow_unauthenticated=True)
    assert opted.sasl_enabled
    assert opted.http_auth == "none"
    secured = _config(
        listener_security_protocol="SASL_PLAINTEXT",
        http_auth="kafka",
        http_allow_plaintext_auth=True,
    )
    assert secured.http_auth == "kafka"


def test_a_plaintext_listener_before_a_sasl_upstream_is_refused_naming_the_opt_in() -> None:
    _refused("listener_allow_unauthenticated")
    _refused("listener_allow_unauthenticated", listener_security_protocol="PLAINTEXT")
    assert _config(listener_allow_unauthenticated=True).listener_protocol == "PLAINTEXT"


def test_the_kafka_settings_count_as_a_sasl_upstream_too() -> None:
    with pytest.raises(ValidationError, match="listener_allow_unauthenticated"):
        ProxyConfig(
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism="PLAIN",
            kafka_sasl_username="svc",
            kafka_sasl_password=SecretStr("pw"),
        )


def test_nothing_to_protect_needs_no_opt_in() -> None:
    # A plain upstream behind a plain listener: the defaults, the local stack without --secure.
    assert ProxyConfig().http_auth == "none"
    assert refusal(
        "PLAINTEXT", "PLAINTEXT", "none",
        http_allow_unauthenticated=False, listener_allow_unauthenticated=False,
    ) is None  # fmt: skip


def test_the_environment_sets_the_opt_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KDELAY_PROXY_HTTP_ALLOW_UNAUTHENTICATED", "true")
    cfg = _config(listener_security_protocol="SASL_PLAINTEXT")
    assert cfg.http_allow_unauthenticated
