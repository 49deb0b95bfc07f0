"""What every SASL session of one Kafka listener shares (proxy/kafka/auth_session.py has one
connection's session): its settings, built once from the proxy's config (:func:`listener_auth`),
and what upstream Kafka said of its mechanisms.

Concurrency: read by the listener's sessions on the asyncio loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from kdelay.proxy.auth.authorization import AclCache
from kdelay.proxy.auth.broker_link import BrokerLink, Link, LinkSettings
from kdelay.proxy.auth.login_backoff import LoginBackoff
from kdelay.proxy.auth.login_gate import LoginGate
from kdelay.proxy.config import ProxyConfig
from kdelay.proxy.metrics import ProxyMetrics

#: The largest frame before authentication (``sasl_max_receive_bytes``; Kafka's own default,
#: 512 KiB, is far more than a login needs).
DEFAULT_MAX_RECEIVE_BYTES: Final = 65_536


class UpstreamMechanisms:
    """The mechanisms upstream Kafka enables, as its latest relayed handshake said (None: not
    asked yet); shared by a listener's sessions."""

    def __init__(self) -> None:
        self.known: tuple[str, ...] | None = None


@dataclass(frozen=True)
class AuthSettings:
    """What every session of one listener shares."""

    mechanisms: tuple[str, ...]
    link: LinkSettings
    cache: AclCache
    backoff: LoginBackoff
    metrics: ProxyMetrics
    timeout_s: float = 30.0
    max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES
    principal_claim: str = "sub"
    clock: Callable[[], float] = time.monotonic
    link_factory: Callable[[LinkSettings], Link] = BrokerLink
    #: The cap on logins in progress (shared with the HTTP API); None: no cap.
    logins: LoginGate | None = None
    upstream: UpstreamMechanisms = field(default_factory=UpstreamMechanisms)


def listener_auth(cfg: ProxyConfig, metrics: ProxyMetrics) -> AuthSettings | None:
    """SASL on the Kafka listener, relayed to upstream Kafka (proxy/kafka/auth_session.py)."""
    if not cfg.sasl_enabled:
        return None
    return AuthSettings(
        mechanisms=cfg.sasl_mechanisms,
        link=LinkSettings.from_upstream(
            cfg.bootstrap_servers,
            cfg.upstream_client_config(),
            timeout_s=cfg.broker_link_timeout_ms / 1000,
        ),
        cache=AclCache(cfg.acl_cache_ms / 1000),
        backoff=LoginBackoff(
            cfg.auth_failure_delay_ms / 1000, cfg.auth_failure_max_delay_ms / 1000
        ),
        metrics=metrics,
        timeout_s=cfg.sasl_authentication_timeout_ms / 1000,
        max_receive_bytes=cfg.sasl_max_receive_bytes,
        principal_claim=cfg.sasl_principal_claim,
        logins=LoginGate(cfg.max_concurrent_logins),
    )
