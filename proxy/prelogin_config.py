"""The proxy's settings that bound what a peer without credentials costs (proxy/auth/prelogin.py,
proxy/auth/login_gate.py, the HTTP body deadline of proxy/http/body.py, whose ``X-Forwarded-For``
is believed); a mixin of ``proxy.config.ProxyConfig``."""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, Field, field_validator


class PreloginSettings(BaseModel):
    """Limits before login (README "Security")."""

    prelogin_max_connections: int = Field(
        default=1_024,
        ge=1,
        description="connections to a SASL Kafka listener not yet logged in, at most; more are "
        "closed at once",
    )
    prelogin_max_connections_per_address: int = Field(
        default=128,
        ge=1,
        description="of those, at most this many from one client address",
    )
    max_concurrent_logins: int = Field(
        default=64,
        ge=1,
        description="logins the proxy works on at once (upstream connection and rounds, SCRAM's "
        "PBKDF2), Kafka listener and HTTP API together; more wait their turn",
    )
    http_body_timeout_ms: int = Field(
        default=30_000,
        ge=100,
        description="an HTTP request body must arrive within this, else 408",
    )
    http_trusted_proxies: tuple[str, ...] = Field(
        default=(),
        description="addresses or CIDR networks of reverse proxies whose X-Forwarded-For is "
        "believed [none: the socket's address is the client's]",
    )

    @field_validator("http_trusted_proxies")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            try:
                ipaddress.ip_network(item.strip(), strict=False)
            except ValueError:
                raise ValueError(
                    f"http_trusted_proxies: {item!r} is not an IP address or CIDR network"
                ) from None
        return tuple(item.strip() for item in value)
