"""HTTP authentication installed (``http_auth = "kafka"``): which requests need credentials.

:class:`Authenticate` is the ASGI middleware that gets each request's caller before any route,
from the authenticator of proxy/http/login.py: every path needs credentials but ``/healthz``,
``/readyz`` and ``/metrics`` (probes and Prometheus), so the console (``/ui/``) and the OpenAPI
pages do too. The caller it establishes is what routes get from
``proxy.http.auth.current_caller``. :func:`authenticator` builds the authenticator from the
proxy's config.

Concurrency: on the proxy's asyncio loop only.
"""

from __future__ import annotations

from typing import Final

from kdelay.proxy.auth.authorization import AclCache
from kdelay.proxy.auth.broker_link import LinkSettings
from kdelay.proxy.auth.jwks import JwksFile
from kdelay.proxy.auth.login_backoff import LoginBackoff
from kdelay.proxy.auth.login_gate import LoginGate
from kdelay.proxy.config import ProxyConfig
from kdelay.proxy.http.auth import STATE_CALLER
from kdelay.proxy.http.errors import ApiError, ASGIApp, Receive, Scope, Send
from kdelay.proxy.http.login import HttpAuthenticator, HttpAuthSettings
from kdelay.proxy.metrics import ProxyMetrics

#: Paths every caller may use: probes and Prometheus scrape them without credentials.
OPEN_PATHS: Final = frozenset({"/healthz", "/readyz", "/metrics"})


class Authenticate:
    """ASGI middleware: every request but those of OPEN_PATHS gets its caller or an error."""

    def __init__(self, app: ASGIApp, authenticator: HttpAuthenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        authorization = None
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                authorization = value.decode("latin-1")
                break
        client = scope.get("client")
        address = str(client[0]) if client else "unknown"
        try:
            caller = await self.authenticator.caller(authorization, address)
        except ApiError as exc:
            await exc.response()(scope, receive, send)
            return
        scope.setdefault("state", {})[STATE_CALLER] = caller
        try:
            await self.app(scope, receive, send)
        finally:
            await self.authenticator.done(caller)


def authenticator(
    cfg: ProxyConfig,
    metrics: ProxyMetrics,
    *,
    cache: AclCache | None = None,
    backoff: LoginBackoff | None = None,
    logins: LoginGate | None = None,
) -> HttpAuthenticator | None:
    """The HTTP API's authenticator for ``cfg`` (None with ``http_auth = "none"``); ``cache`` and
    ``backoff`` are the Kafka listener's when it has them, so both share Kafka's answers and an
    address's failed logins. Links connect as the proxy's upstream does (TLS and its CA:
    ``upstream_client_config``); its SASL user is never used."""
    if cfg.http_auth == "none":
        return None
    conf = cfg.upstream_client_config()
    jwks = None
    if cfg.http_jwks_file is not None:
        jwks = JwksFile(
            cfg.http_jwks_file, cfg.sasl_principal_claim, audience=cfg.http_jwt_audience
        )
    settings = HttpAuthSettings(
        mechanism=cfg.http_sasl_mechanism,
        link=LinkSettings.from_upstream(
            cfg.bootstrap_servers, conf, timeout_s=cfg.broker_link_timeout_ms / 1000
        ),
        cache=cache or AclCache(cfg.acl_cache_ms / 1000),
        backoff=backoff
        or LoginBackoff(cfg.auth_failure_delay_ms / 1000, cfg.auth_failure_max_delay_ms / 1000),
        metrics=metrics,
        login_ttl_s=cfg.acl_cache_ms / 1000,
        jwks=jwks,
        logins=logins or LoginGate(cfg.max_concurrent_logins),
    )
    return HttpAuthenticator(settings)
