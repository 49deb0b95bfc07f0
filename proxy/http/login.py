"""HTTP API authentication (``http_auth = "kafka"``): each request's credentials checked by Kafka.

The proxy keeps no users. For a request's ``Authorization`` header it logs in to upstream Kafka
as that principal, on a connection of its own (proxy/auth/broker_link.py, as the Kafka listener's
SASL relay does), and asks Kafka on that connection what the principal may do
(proxy/authorization.TopicAccess, with an AclCache):

- ``Basic <base64(user:password)>``: a SASL login with ``http_sasl_mechanism`` (SCRAM-SHA-512 by
  default, SCRAM-SHA-256 or PLAIN; proxy/auth/sasl_client.py) as the user name SASLprep'd (RFC 4013,
  proxy/auth/saslprep.py), which is the name Kafka authenticates; the principal is ``User:<that
  name>``, so ``alice`` and ``alice\u00ad`` are one principal and one ACL cache key.
- ``Bearer <JWT>`` (with ``http_jwks_file``): the token validated first against the JWKS file
  (proxy/auth/jwks.py: signature, ``exp``, ``nbf``; the principal ``User:<sasl_principal_claim>``),
  then an OAUTHBEARER login with the same token, so Kafka accepts it too and says what it may do.

A successful login is reused for ``acl_cache_ms`` (never past a token's ``exp`` or Kafka's
session lifetime), keyed by an HMAC of the credentials under a key made at start: no password or
token is kept, only the open connection and the principal. Its connection closes when it
expires. A failed login (no, malformed or wrong credentials, an invalid token) is answered 401
after the address's wait of proxy/auth/login_backoff.py, with ``WWW-Authenticate: Basic
realm="kdelay"`` (and ``Bearer realm="kdelay"`` with a JWKS file), and counts in
``kdelay_proxy_auth_failures_total{mechanism,reason}`` with ``http_`` reasons; a request without
credentials is not a failed login (no wait). Kafka unreachable: 503 with ``Retry-After``.
Neither the 401 nor the log quotes anything of the ``Authorization`` header: it is the client's
text (a password typed in the wrong place, a forged token's header, a log injection).

:class:`HttpAuthenticator` turns a request's header into its caller (proxy/http/auth.py
``KafkaCaller``); the middleware of proxy/http/authenticate.py calls it before any route.

Concurrency: on the proxy's asyncio loop only. Requests with the same new credentials at the
same time share one login (and its outcome); a login's connection serialises its Metadata
requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, NoReturn, Protocol

from kdelay import logs
from kdelay.buffer import BUFFER_TOPIC
from kdelay.proxy import metric_labels, sasl
from kdelay.proxy.auth.authorization import AclCache, TopicAccess
from kdelay.proxy.auth.broker_link import BrokerLink, Link, LinkError, LinkSettings
from kdelay.proxy.auth.jwks import InvalidTokenError, JwksFile
from kdelay.proxy.auth.login_backoff import LoginBackoff
from kdelay.proxy.auth.login_gate import LoginGate, LoginsBusyError
from kdelay.proxy.auth.sasl_client import LoginRefusedError, login
from kdelay.proxy.auth.saslprep import InvalidNameError, saslprep
from kdelay.proxy.http.auth import Caller, KafkaCaller, UnauthenticatedError
from kdelay.proxy.http.credentials import (
    Basic,
    Bearer,
    MalformedCredentialsError,
    parse_authorization,
)
from kdelay.proxy.http.errors import UnavailableError
from kdelay.proxy.metrics import ProxyMetrics

log = logs.get(__name__)

REALM: Final = "kdelay"
#: How many logins are kept at most (each holds a connection to Kafka); oldest go first.
MAX_LOGINS: Final = 1_000
#: The mechanism label of a request whose credentials name none (absent or malformed).
NO_MECHANISM: Final = metric_labels.NO_MECHANISM


class Timer(Protocol):
    """A scheduled call that can be called off (``asyncio.TimerHandle``)."""

    def cancel(self) -> None: ...


def call_later(delay_s: float, callback: Callable[[], None]) -> Timer:
    """``callback`` after ``delay_s`` on the running loop: how a kept login expires."""
    return asyncio.get_running_loop().call_later(delay_s, callback)


@dataclass
class _Login:
    caller: KafkaCaller
    timer: Timer | None = None


@dataclass(frozen=True)
class HttpAuthSettings:
    """What the authenticator needs (built from ProxyConfig by ``authenticator``,
    proxy/http/authenticate.py)."""

    mechanism: str
    link: LinkSettings
    cache: AclCache
    backoff: LoginBackoff
    metrics: ProxyMetrics
    login_ttl_s: float
    jwks: JwksFile | None = None
    buffer_topic: str = BUFFER_TOPIC
    link_factory: Callable[[LinkSettings], Link] = BrokerLink
    clock: Callable[[], float] = time.time
    #: The HMAC key of the login cache: made at start, never stored.
    salt: bytes = field(default_factory=lambda: os.urandom(32))
    #: The cap on logins in progress, shared with the Kafka listener (proxy/auth/login_gate.py).
    logins: LoginGate | None = None
    #: Schedules a kept login's expiry (tests pass timers they fire themselves).
    timer: Callable[[float, Callable[[], None]], Timer] = call_later


class HttpAuthenticator:
    """Turns a request's ``Authorization`` header into its caller (see the module docstring)."""

    def __init__(self, settings: HttpAuthSettings) -> None:
        self.settings = settings
        self.metrics = settings.metrics
        self._logins: OrderedDict[bytes, _Login] = OrderedDict()
        #: Connections being closed (kept referenced until they are).
        self._closing: set[asyncio.Task[None]] = set()
        #: Logins in progress, by the same key.
        self._pending: dict[bytes, asyncio.Future[KafkaCaller]] = {}
        challenges = [f'Basic realm="{REALM}", charset="UTF-8"']
        if settings.jwks is not None:
            challenges.append(f'Bearer realm="{REALM}"')
        self.challenge = ", ".join(challenges)

    def __len__(self) -> int:
        """How many logins are kept."""
        return len(self._logins)

    def logins(self) -> Mapping[bytes, KafkaCaller]:
        """The kept logins' callers (a copy), by the HMAC of their credentials: never the
        credentials themselves."""
        return {key: entry.caller for key, entry in self._logins.items()}

    async def caller(self, authorization: str | None, address: str) -> Caller:
        """The caller of a request from ``address``; raises UnauthenticatedError (401) or
        UnavailableError (503)."""
        try:
            credentials = parse_authorization(authorization)
        except MalformedCredentialsError as exc:
            await self._failed(NO_MECHANISM, "http_malformed", str(exc), address)
        if credentials is None:
            self._count(NO_MECHANISM, "http_missing_credentials")
            raise self._unauthenticated("this request carries no credentials (Authorization)")
        # A shared login can be retired and closed before a request that waited for it
        # resumes (its lifetime was a token's last milliseconds): that request logs in again.
        for _ in range(3):
            if isinstance(credentials, Bearer):
                caller = await self._bearer(credentials, address)
            else:
                caller = await self._basic(credentials, address)
            if caller.acquire():
                return caller
        raise UnavailableError("the login to upstream Kafka kept expiring before it was used")

    async def _basic(self, cred: Basic, address: str) -> KafkaCaller:
        mechanism = self.settings.mechanism
        try:
            # The name Kafka will authenticate (proxy/auth/saslprep.py): the principal, the login
            # and the ACL cache all use it, never the header's spelling.
            username = saslprep(cred.username)
        except InvalidNameError as exc:
            await self._failed(mechanism, "http_malformed", str(exc), address)
        key = self._key("basic", mechanism, username, cred.password)
        found = self._logins.get(key)
        if found is not None:
            return found.caller
        principal = sasl.Principal(username)
        return await self._login(
            key,
            principal,
            mechanism,
            username=username,
            secret=cred.password,
            address=address,
            expires_at=None,
        )

    async def _bearer(self, cred: Bearer, address: str) -> KafkaCaller:
        mechanism = sasl.OAUTHBEARER
        jwks = self.settings.jwks
        if jwks is None:
            await self._failed(
                mechanism,
                "http_unsupported_scheme",
                "Bearer tokens are not accepted: http_jwks_file is not set",
                address,
            )
        key = self._key("bearer", mechanism, "", cred.token)
        found = self._logins.get(key)
        if found is not None:
            return found.caller
        try:
            valid = jwks.validate(cred.token)
        except InvalidTokenError as exc:
            await self._failed(mechanism, "http_invalid_token", str(exc), address)
        _, _, name = valid.principal.partition(":")
        return await self._login(
            key,
            sasl.Principal(name),
            mechanism,
            username="",
            secret=cred.token,
            address=address,
            expires_at=valid.expires_at,
        )

    async def _login(
        self,
        key: bytes,
        principal: sasl.Principal,
        mechanism: str,
        *,
        username: str,
        secret: str,
        address: str,
        expires_at: float | None,
    ) -> KafkaCaller:
        """The caller, logged in once for requests that bring the same new credentials at the
        same time (a SCRAM login costs Kafka thousands of hash iterations): they wait for the
        login in progress and share its outcome, its 401 included."""
        log_in = functools.partial(
            self._log_in, key, principal, mechanism, username, secret, address, expires_at
        )
        if self.settings.login_ttl_s <= 0:  # nothing is shared: each request logs in
            return await log_in()
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(log_in())
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        # A waiter that goes away (its client disconnected) leaves the login to the others.
        return await asyncio.shield(pending)

    async def _log_in(  # noqa: PLR0917 - private, bound once above
        self,
        key: bytes,
        principal: sasl.Principal,
        mechanism: str,
        username: str,
        secret: str,
        address: str,
        expires_at: float | None,
    ) -> KafkaCaller:
        link = self.settings.link_factory(self.settings.link)
        gate = self.settings.logins
        try:
            async with gate.slot(self.settings.link.timeout_s) if gate else _no_slot():
                await link.connect()
                lifetime_ms = await login(link, mechanism, username, secret)
        except LoginsBusyError as exc:
            await link.close()
            log.warning("proxy.http_logins_busy", mechanism=mechanism, error=str(exc))
            raise UnavailableError(f"too many logins in progress: {exc}") from None
        except LoginRefusedError as exc:
            await link.close()
            await self._failed(mechanism, f"http_{exc.reason}", str(exc), address)
        except LinkError as exc:
            await link.close()
            self._count(mechanism, "http_upstream_unavailable")
            log.warning("proxy.http_auth_unavailable", mechanism=mechanism, error=str(exc))
            raise UnavailableError(
                f"upstream Kafka cannot check the credentials now: {exc}"
            ) from None
        ttl = self.settings.login_ttl_s
        if lifetime_ms > 0:
            ttl = min(ttl, lifetime_ms / 1000)
        if expires_at is not None:
            ttl = min(ttl, expires_at - self.settings.clock())
        access = TopicAccess(principal, link, self.settings.cache)
        caller = KafkaCaller(
            principal, access, self.settings.buffer_topic, lambda: self._forget(key, entry)
        )
        entry = _Login(caller)
        self.metrics.authentications.labels(
            metric_labels.mechanism(mechanism, sasl.MECHANISMS), "http"
        ).inc()
        log.info(
            "proxy.http_authenticated",
            principal=str(principal),
            mechanism=mechanism,
            peer=address,
            reused_for_s=round(max(ttl, 0.0), 3),
        )
        if ttl > 0:
            self._remember(key, entry, ttl)
        else:
            # Not reusable: the connection serves this request's questions, then closes.
            caller.retired = True
        return caller

    async def done(self, caller: Caller) -> None:
        """The request of ``caller`` is answered: its login's connection closes if it was
        retired meanwhile and no other request uses it."""
        if isinstance(caller, KafkaCaller):
            caller.users -= 1
            if caller.retired and caller.users <= 0 and not caller.closed:
                caller.closed = True
                await caller.link.close()

    def _remember(self, key: bytes, entry: _Login, ttl_s: float) -> None:
        old = self._logins.pop(key, None)
        if old is not None:
            self._drop(old)
        self._logins[key] = entry
        entry.timer = self.settings.timer(ttl_s, lambda: self._forget(key, entry))
        while len(self._logins) > MAX_LOGINS:
            _, oldest = self._logins.popitem(last=False)
            self._drop(oldest)

    def _forget(self, key: bytes, entry: _Login) -> None:
        """``entry`` expired or its connection failed: the next request logs in again."""
        if self._logins.get(key) is entry:
            del self._logins[key]
        self._drop(entry)

    def _drop(self, entry: _Login) -> None:
        """Retire ``entry`` (out of the cache): its connection closes now if unused, else when
        its last request is answered (``done``)."""
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None
        caller = entry.caller
        caller.retired = True
        if caller.users <= 0 and not caller.closed:
            caller.closed = True
            task = asyncio.get_running_loop().create_task(caller.link.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every kept login's connection (the proxy stops)."""
        entries, self._logins = list(self._logins.values()), OrderedDict()
        for entry in entries:
            if entry.timer is not None:
                entry.timer.cancel()
            entry.caller.retired = entry.caller.closed = True
            await entry.caller.link.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _key(self, scheme: str, mechanism: str, username: str, secret: str) -> bytes:
        text = "\0".join((scheme, mechanism, username, secret)).encode()
        return hmac.new(self.settings.salt, text, hashlib.sha256).digest()

    async def _failed(self, mechanism: str, reason: str, message: str, address: str) -> NoReturn:
        """Count a failed login, wait the address's backoff, and raise its 401."""
        self._count(mechanism, reason)
        delay = self.settings.backoff.failed(address)
        log.info(
            "proxy.http_authentication_failed",
            mechanism=mechanism,
            reason=reason,
            error=message,
            peer=address,
            delay_s=round(delay, 3),
        )
        if delay > 0:
            await asyncio.sleep(delay)
        raise self._unauthenticated(message)

    def _count(self, mechanism: str, reason: str) -> None:
        """Count a failed login, its labels from closed sets (proxy/metric_labels.py)."""
        self.metrics.auth_failures.labels(
            metric_labels.mechanism(mechanism, (*sasl.MECHANISMS, NO_MECHANISM)),
            metric_labels.auth_reason(reason),
        ).inc()

    def _unauthenticated(self, message: str) -> UnauthenticatedError:
        return UnauthenticatedError(message, headers={"WWW-Authenticate": self.challenge})


def _no_slot() -> contextlib.AbstractAsyncContextManager[None]:
    return contextlib.nullcontext()
