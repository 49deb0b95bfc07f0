"""The proxy's settings of the logins it relays and checks: SASL on the Kafka listener
(proxy/kafka/auth_session.py) and the HTTP API's logins to Kafka (proxy/http/login.py), what
Kafka's answers are cached for (proxy/auth/authorization.py), the wait after a failed login
(proxy/auth/login_backoff.py); a part of ``proxy.config.ProxyConfig``, like
proxy/prelogin_config.py."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from kdelay.proxy.sasl import MECHANISMS


class LoginSettings(BaseModel):
    """Logins relayed to Kafka and checked by it (README "Security")."""

    sasl_mechanisms: tuple[str, ...] = Field(
        default=MECHANISMS,
        description="SASL mechanisms the listener offers (upstream Kafka must enable them too)",
    )
    sasl_authentication_timeout_ms: int = Field(
        default=30_000, ge=100, description="close a connection not authenticated this long"
    )
    sasl_max_receive_bytes: int = Field(
        default=65_536,
        ge=1024,
        description="largest request before authentication, reserving nothing of "
        "max_buffered_request_bytes (Kafka's sasl.server.max.receive.size, 512 KiB there; a "
        "login's largest, an OAUTHBEARER token, needs a few KiB)",
    )
    sasl_principal_claim: str = Field(
        default="sub",
        min_length=1,
        description="the OAUTHBEARER token claim that names the principal (as upstream Kafka's)",
    )
    acl_cache_ms: int = Field(
        default=5_000,
        ge=0,
        description="how long Kafka's answer to what a principal may do with a topic is reused: "
        "a revoked ACL takes effect within this (0: ask for every request)",
    )
    auth_failure_delay_ms: int = Field(
        default=100,
        ge=0,
        description="wait before answering a failed login, doubling with each further failure "
        "from the same address (Kafka's connection.failed.authentication.delay.ms)",
    )
    auth_failure_max_delay_ms: int = Field(
        default=5_000, ge=0, description="longest wait before answering a failed login"
    )
    broker_link_timeout_ms: int = Field(
        default=10_000,
        ge=100,
        description="longest wait for upstream Kafka on a SASL client's own connection to it",
    )

    @field_validator("sasl_mechanisms")
    @classmethod
    def _mechanisms(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [m for m in value if m not in MECHANISMS]
        if unknown or not value:
            raise ValueError(f"sasl_mechanisms must be some of {', '.join(MECHANISMS)}")
        return tuple(dict.fromkeys(value))
