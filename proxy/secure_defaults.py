"""Secure by default: a proxy refuses to start with a door left open beside a locked one.

Two combinations hand anyone who can reach a port what the Kafka listener's SASL login (or
upstream Kafka's) was there to withhold:

- A Kafka listener that requires SASL with an HTTP API that requires nothing
  (``http_auth=none``): anyone may schedule, list and cancel messages over HTTP as the proxy's
  own upstream principal, bypassing the logins the listener relays.
- A Kafka listener without SASL (PLAINTEXT or SSL) in front of an upstream that requires it:
  every client produces as the proxy's upstream principal, without credentials.

Each is refused at start-up with a message naming the setting, unless an explicit opt-in says
the network in front of the proxy is trusted (``http_allow_unauthenticated``,
``listener_allow_unauthenticated``). The chart applies the same rule when it renders
(helm/kdelay/templates/_security.tpl).
"""

from __future__ import annotations

from typing import Protocol, Self, cast

from pydantic import BaseModel, Field, model_validator


class _Exposure(Protocol):
    """What the check reads from the proxy's config (proxy/config.py ``ProxyConfig``)."""

    http_auth: str

    @property
    def listener_protocol(self) -> str: ...

    def upstream_client_config(self) -> dict[str, str]: ...


def refusal(
    listener_protocol: str,
    upstream_protocol: str,
    http_auth: str,
    *,
    http_allow_unauthenticated: bool,
    listener_allow_unauthenticated: bool,
) -> str | None:
    """Why this combination may not start (naming the setting that allows it), or None."""
    listener_sasl = listener_protocol.upper().startswith("SASL_")
    upstream_sasl = upstream_protocol.upper().startswith("SASL_")
    # A SASL listener on a plain upstream is refused by ProxyConfig itself, with its reason.
    if listener_sasl and upstream_sasl and http_auth == "none" and not http_allow_unauthenticated:
        return (
            f"listener_security_protocol {listener_protocol} requires a SASL login on the Kafka "
            "listener, but the HTTP API requires none (http_auth=none): anyone who reaches it "
            "acts as the proxy's upstream principal. Set http_auth=kafka, or "
            "http_allow_unauthenticated=true to accept that risk on a trusted network"
        )
    if not listener_sasl and upstream_sasl and not listener_allow_unauthenticated:
        return (
            f"upstream Kafka requires a SASL login ({upstream_protocol}), but the proxy's Kafka "
            f"listener requires none (listener_security_protocol {listener_protocol}): every "
            "client would produce as the proxy's upstream principal. Set "
            "listener_security_protocol to SASL_SSL or SASL_PLAINTEXT, or "
            "listener_allow_unauthenticated=true to accept that risk on a trusted network"
        )
    return None


class SecureDefaults(BaseModel):
    """The two opt-ins and the start-up check (a mixin of ``ProxyConfig``)."""

    http_allow_unauthenticated: bool = Field(
        default=False,
        description="start with an HTTP API open to anyone (http_auth=none) although the Kafka "
        "listener requires SASL: anyone reaching it acts as the proxy's upstream principal "
        "(a trusted network only)",
    )
    listener_allow_unauthenticated: bool = Field(
        default=False,
        description="start with a Kafka listener without SASL in front of an upstream that "
        "requires it: every client produces as the proxy's upstream principal (a trusted "
        "network only)",
    )

    @model_validator(mode="after")
    def _secure_defaults(self) -> Self:
        config = cast(_Exposure, self)
        upstream = config.upstream_client_config().get("security.protocol", "PLAINTEXT")
        problem = refusal(
            config.listener_protocol,
            upstream,
            config.http_auth,
            http_allow_unauthenticated=self.http_allow_unauthenticated,
            listener_allow_unauthenticated=self.listener_allow_unauthenticated,
        )
        if problem is not None:
            raise ValueError(problem)
        return self
