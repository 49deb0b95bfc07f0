"""Metric label values from closed sets: what a client sends never becomes a new series.

Every Prometheus label of the proxy that client input can reach (the Kafka API key and version,
a request's result, the HTTP method, route and status, a SASL mechanism, a failure reason) goes
through one of the functions here, which return a value of a fixed set, or :data:`OTHER`. Each
distinct label value is a series kept for the process's life and written into every scrape of
``/metrics``, so a label taken as sent lets an unauthenticated peer grow the proxy's memory and
its scrapes without bound (2,000 ApiVersions with distinct unsupported versions
and 300 made-up HTTP methods grew ``/metrics`` from 11.6 KB to 494.5 KB). A value kdelay itself
adds (a new failure reason) must be added to its set here, or it is counted as ``other``.

Pure functions, no state.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

import kafka.errors as kerr

from kdelay.proxy.wire import protocol as p

#: The value of every label whose input is outside its set.
OTHER: Final = "other"
#: The mechanism label before a client named one (docs/metrics.md).
NO_MECHANISM: Final = "none"

#: RFC 9110's methods; anything else (any case but upper) is ``other``.
HTTP_METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "CONNECT", "TRACE"}
)
#: The highest version of each API the proxy can decode (kafka-python's classes): versions above
#: it, however many a client invents, are ``other``.
_MAX_VERSIONS: Final = {key: int(spec.request.max_version) for key, spec in p.APIS.items()} | {
    key: int(spec.request.max_version) for key, spec in p.SASL_APIS.items()
}
#: A request's result: ``ok`` or Kafka's name for an error code (kafka-python's table; an
#: unknown code is its ``UNKNOWN``).
RESULTS: Final = frozenset(
    {"ok", kerr.UnknownError.message, *(cls.message for cls in kerr.kafka_errors.values())}
)
#: Why a SASL login failed on the Kafka listener (proxy/kafka/auth_session.py,
#: proxy/kafka/connection.py).
SASL_REASONS: Final = frozenset(
    {
        "invalid_credentials",
        "rejected",
        "unsupported_mechanism",
        "illegal_state",
        "timeout",
        "malformed",
        "upstream_unavailable",
        "session_expired",
        "principal_unknown",
    }
)
#: Why an HTTP API login failed (proxy/http/login.py): the listener's reasons prefixed ``http_``
#: and the HTTP API's own.
HTTP_REASONS: Final = frozenset(
    {f"http_{r}" for r in SASL_REASONS}
    | {"http_missing_credentials", "http_unsupported_scheme", "http_invalid_token"}
)
AUTH_REASONS: Final = SASL_REASONS | HTTP_REASONS


def api(api_key: int) -> str:
    """The API's name (``Produce``) for an API the proxy knows, else ``other``."""
    return p.API_NAMES.get(api_key, OTHER)


def api_version(api_key: int, version: int) -> str:
    """The version, for an API the proxy knows and a version it can decode, else ``other``."""
    highest = _MAX_VERSIONS.get(api_key)
    if highest is None or not 0 <= version <= highest:
        return OTHER
    return str(version)


def result(name: str) -> str:
    """``ok`` or a Kafka error name, else ``other``."""
    return name if name in RESULTS else OTHER


def http_method(method: str) -> str:
    """An RFC 9110 method as sent (methods are case-sensitive), else ``other``."""
    return method if method in HTTP_METHODS else OTHER


def http_status(status: int) -> str:
    """A status code 100-599, else ``other``."""
    return str(status) if 100 <= status <= 599 else OTHER


def http_route(route: object, routes: Collection[str]) -> str:
    """The path template of the route a request matched (``/v1/messages/{id}``), one of the
    application's ``routes``; ``unmatched`` when none matched (the path as sent is never a
    label)."""
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path in routes else "unmatched"


def mechanism(name: str | None, enabled: Collection[str]) -> str:
    """An ``enabled`` mechanism; ``none`` before a client named one; else ``other``."""
    if name is None:
        return NO_MECHANISM
    return name if name in enabled else OTHER


def auth_reason(reason: str) -> str:
    """A login failure's reason of :data:`AUTH_REASONS` (docs/metrics.md), else ``other``."""
    return reason if reason in AUTH_REASONS else OTHER
