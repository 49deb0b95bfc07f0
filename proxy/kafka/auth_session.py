"""SASL on the proxy's Kafka listener: one client connection's login, relayed to Kafka.

When ``listener_security_protocol`` is SASL_PLAINTEXT or SASL_SSL, every connection gets an
``AuthSession``. The listener (proxy/kafka/server.py) hands it each decoded request first; the
session answers the SASL APIs itself and refuses what Kafka would refuse, and lets the rest through
to the broker once the connection is authenticated. What Kafka's own SASL server does
(``SaslServerAuthenticator``), the session does, with Kafka judging the credentials:

- SaslHandshake (v0 or v1, as Kafka advertises; after a v0 handshake the client sends bare SASL
  tokens, which the connection wraps as SaslAuthenticate v0) names a mechanism. One the proxy does
  not enable gets UNSUPPORTED_SASL_MECHANISM with the enabled list, and the connection closes.
  Otherwise the session answers it without asking upstream (a handshake is free to send, so it must
  cost nothing upstream): the mechanisms both enable, as far as an earlier relayed handshake told
  (``UpstreamMechanisms``), else the proxy's. The link (proxy/auth/broker_link.py: a connection of
  its own to an upstream broker's SASL listener) opens with the first SaslAuthenticate, which relays
  the handshake first; a mechanism the broker refuses then answers that SaslAuthenticate
  UNSUPPORTED_SASL_MECHANISM and the connection closes.
- Each SaslAuthenticate (v0-2) is relayed to the broker (always as v1, so the broker tells the
  session lifetime) and its answer relayed back at the client's version. When proxy/sasl.py says the
  exchange is complete, the connection is authenticated as the principal the client's first token
  named (``User:<name>``), and ``access`` (proxy/auth/authorization.py) asks Kafka, on that same
  link, what the principal may do. A failure is answered with the broker's error and message
  (SASL_AUTHENTICATION_FAILED, "Authentication failed during authentication due to invalid
  credentials with SASL mechanism ..."), after the per-address wait of proxy/auth/login_backoff.py,
  and the connection closes, as Kafka closes it.
- Out of order: before the handshake, any request but ApiVersions and SaslHandshake closes the
  connection unanswered (Kafka: "Unexpected Kafka request ... during SASL handshake"), except a
  SaslAuthenticate, answered ILLEGAL_SASL_STATE first; during the exchange anything but
  SaslAuthenticate is answered ILLEGAL_SASL_STATE (SaslHandshake; other APIs unanswered) and the
  connection closes. Once authenticated, a SaslAuthenticate without a handshake is answered
  ILLEGAL_SASL_STATE and the connection stays open.
- Re-authentication (KIP-368): a SaslHandshake on an authenticated connection whose client
  uses SaslAuthenticate v1+ starts a new exchange, relayed on the same link (which
  re-authenticates the link too); the principal must stay the same. When the broker gave a
  session lifetime, a request other than ApiVersions or SaslHandshake after it ran out closes
  the connection, as Kafka does.
- Limits before authentication: a frame larger than ``max_receive_bytes`` (Kafka's
  ``sasl.server.max.receive.size``) closes the connection, and so does not being authenticated
  ``timeout_s`` after connecting (proxy/kafka/server.py applies both, through ``frame_limit`` and
  ``auth_deadline``). Opening the link and each relayed round hold a slot of ``logins``
  (proxy/auth/login_gate.py, ``max_concurrent_logins``) while they run; none free before the login
  deadline closes the connection.

Every failure counts in ``kdelay_proxy_auth_failures_total{mechanism,reason}``. Passwords and
tokens are never kept or logged: only the principal's name is taken from them.

Concurrency: one session per connection, used by its reader task on the asyncio loop only;
requests reach it one at a time, so the link is never used by two at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

import kafka.errors as kerr
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kdelay import logs
from kdelay.proxy import metric_labels, sasl
from kdelay.proxy.auth.authorization import TopicAccess
from kdelay.proxy.auth.broker_link import Link, LinkError
from kdelay.proxy.auth.login_gate import LoginsBusyError
from kdelay.proxy.kafka import sasl_answers as answers
from kdelay.proxy.kafka.auth_settings import AuthSettings
from kdelay.proxy.kafka.broker import Reply, resolved
from kdelay.proxy.wire import protocol as p

log = logs.get(__name__)

UNSUPPORTED_MECHANISM: Final = kerr.UnsupportedSaslMechanismError.errno
AUTH_FAILED: Final = kerr.SaslAuthenticationFailedError.errno
#: The SaslAuthenticate version links use: the first with the session lifetime (KIP-368).
_LINK_AUTH_VERSION: Final = 1


class Phase(Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"
    AUTHENTICATED = "authenticated"


@dataclass(frozen=True, slots=True)
class Screened:
    """The session's verdict on a request it took: the reply to queue (None: none), then
    whether to close the connection (``close`` is the log event)."""

    reply: Awaitable[Reply] | None
    close: str | None = None
    fields: Mapping[str, object] = field(default_factory=dict)


class AuthSession:
    """One connection's SASL state (see the module docstring)."""

    def __init__(self, settings: AuthSettings, address: str) -> None:
        self.settings = settings
        self.address = address
        self.metrics = settings.metrics
        self.phase = Phase.HANDSHAKE
        self.mechanism: str | None = None
        self.principal: sasl.Principal | None = None
        #: What the principal may do (set once authenticated).
        self.access: TopicAccess | None = None
        self.auth_deadline = settings.clock() + settings.timeout_s
        self.expires_at: float | None = None
        self._link: Link | None = None
        self._round = 0
        self._claim: sasl.Claim | None = None
        self._claim_error = ""
        self._reauth_capable = False
        self._reauthenticating = False
        #: The handshake is answered; it is relayed with the first SaslAuthenticate.
        self._handshake_owed = False

    @property
    def authenticated(self) -> bool:
        return self.phase is Phase.AUTHENTICATED

    def frame_limit(self, limit: int) -> int:
        """The largest frame accepted now: ``max_receive_bytes`` until authenticated."""
        return limit if self.principal is not None else min(limit, self.settings.max_receive_bytes)

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()

    def failed(self, reason: str) -> None:
        """Count a failure the listener saw (a timeout, a malformed or oversized frame)."""
        self._count(reason, self.mechanism)

    # -- the requests -----------------------------------------------------------------------

    async def screen(self, req: p.Request) -> Screened | None:
        """The verdict on ``req``, or None to pass it on to the broker."""
        key = req.api_key
        if key == p.SASL_HANDSHAKE:
            return await self._handshake(req)
        if key == p.SASL_AUTHENTICATE:
            return await self._authenticate(req)
        if key == p.API_VERSIONS and self.phase is not Phase.AUTHENTICATE:
            return None
        if self.phase is Phase.AUTHENTICATED:
            if self.expires_at is not None and self.settings.clock() >= self.expires_at:
                self.failed("session_expired")
                return Screened(None, "proxy.sasl_session_expired", self._who())
            return None
        self.failed("illegal_state")
        name = p.API_NAMES.get(key, str(key))
        return Screened(None, "proxy.sasl_illegal_state", {"api": name, "phase": self.phase.value})

    async def _handshake(self, req: p.Request) -> Screened:
        mechanism = str(req.body.mechanism)
        enabled = self.settings.mechanisms
        if self.phase is Phase.AUTHENTICATE:
            return self._refuse(req, "SaslHandshake during the SASL exchange", close=True)
        if self.phase is Phase.AUTHENTICATED and not self._reauth_capable:
            # Kafka answers a handshake on an authenticated connection whose client cannot
            # re-authenticate (SaslAuthenticate v0) as an illegal state, and keeps it open.
            return self._refuse(req, "SaslHandshake after authentication", close=False)
        if mechanism not in enabled:
            self._count("unsupported_mechanism", "other")
            return self._fail_reply(
                answers.handshake(req.api_version, UNSUPPORTED_MECHANISM, enabled),
                "proxy.sasl_unsupported_mechanism",
                {"enabled": ",".join(enabled)},
            )
        reauth = self.phase is Phase.AUTHENTICATED
        known = self.settings.upstream.known
        if reauth:  # re-authentication relays at once, on the link already open
            try:
                error, offered = await self._relay_handshake(mechanism)
            except (LinkError, LoginsBusyError) as exc:
                return self._link_lost(exc, mechanism)
        else:
            offered = known if known is not None else enabled
            error = 0 if mechanism in offered else UNSUPPORTED_MECHANISM
        reply = answers.handshake(req.api_version, error, [m for m in offered if m in enabled])
        if error:
            self._count("unsupported_mechanism", mechanism)
            return self._fail_reply(
                reply,
                "proxy.sasl_unsupported_mechanism",
                {"mechanism": mechanism, "upstream": ",".join(offered)},
            )
        self._reauthenticating = reauth
        self._handshake_owed = not reauth
        self.phase = Phase.AUTHENTICATE
        self.mechanism = mechanism
        self._round = 0
        self._claim = None
        return Screened(resolved(reply))

    async def _relay_handshake(self, mechanism: str) -> tuple[int, tuple[str, ...]]:
        """Open the link if needed and relay the handshake: the broker's error and the
        mechanisms it enables (remembered for the next sessions' answers)."""
        async with self._login_slot():
            link = await self._open_link()
            answer = await link.request(SaslHandshakeRequest(mechanism=mechanism, version=1))
        offered = tuple(str(m) for m in answer.mechanisms)
        self.settings.upstream.known = offered
        return int(answer.error_code), offered

    async def _relay_owed_handshake(self, req: p.Request, mechanism: str) -> Screened | None:
        """Before the first round: the link opened and the handshake relayed (it was answered
        without upstream); the refusal to answer ``req`` with, or None to go on."""
        if not self._handshake_owed:
            return None
        self._handshake_owed = False
        try:
            error, offered = await self._relay_handshake(mechanism)
        except (LinkError, LoginsBusyError) as exc:
            return self._link_lost(exc, mechanism)
        if not error:
            return None
        self._count("unsupported_mechanism", mechanism)
        message = (
            f"upstream Kafka does not enable SASL mechanism {mechanism} "
            f"(it enables {', '.join(offered) or 'none'})"
        )
        return self._fail_reply(
            answers.authenticate(req.api_version, UNSUPPORTED_MECHANISM, message),
            "proxy.sasl_unsupported_mechanism",
            {"mechanism": mechanism, "upstream": ",".join(offered)},
        )

    def _login_slot(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A slot of ``max_concurrent_logins``, waited for until the login deadline (for a
        re-authentication, the link's timeout); no gate, no cap."""
        gate = self.settings.logins
        if gate is None:
            return contextlib.nullcontext()
        if self.principal is not None:
            return gate.slot(self.settings.link.timeout_s)
        return gate.slot(self.auth_deadline - self.settings.clock())

    async def _open_link(self) -> Link:
        """The link, connected first when this is the connection's first login."""
        if self._link is not None and self._link.open:
            return self._link
        if self.principal is not None:
            # Re-authentication must reach the broker the connection logged in through.
            raise LinkError("the link to the broker closed while the connection was in use")
        self._link = self.settings.link_factory(self.settings.link)
        await self._link.connect()
        return self._link

    async def _authenticate(self, req: p.Request) -> Screened:
        if self.phase is Phase.HANDSHAKE:
            return self._refuse(req, "SaslAuthenticate before SaslHandshake", close=True)
        if self.phase is Phase.AUTHENTICATED:
            return self._refuse(req, "SaslAuthenticate request received after successful "
                                "authentication", close=False)  # fmt: skip
        assert self.mechanism is not None
        refused = await self._relay_owed_handshake(req, self.mechanism)
        return refused if refused is not None else await self._relay_round(req, self.mechanism)

    async def _relay_round(self, req: p.Request, mechanism: str) -> Screened:
        """One SaslAuthenticate relayed to the broker, its answer relayed back."""
        assert self._link is not None
        token = bytes(req.body.auth_bytes)
        if req.api_version > 0:
            self._reauth_capable = True
        if self._round == 0:
            try:
                self._claim = sasl.claim(
                    mechanism, token, principal_claim=self.settings.principal_claim
                )
            except sasl.SaslTokenError as exc:
                self._claim, self._claim_error = None, str(exc)  # the broker judges it
        try:
            async with self._login_slot():
                answer = await self._link.request(
                    SaslAuthenticateRequest(auth_bytes=token, version=_LINK_AUTH_VERSION)
                )
        except (LinkError, LoginsBusyError) as exc:
            return self._link_lost(exc, mechanism)
        if answer.error_code:
            reason = "invalid_credentials" if answer.error_code == AUTH_FAILED else "rejected"
            self._count(reason, mechanism)
            return self._auth_failure(req, answer.error_code, answer.error_message, reason)
        server_bytes = bytes(answer.auth_bytes)
        done = sasl.complete(mechanism, self._round, server_bytes)
        self._round += 1
        lifetime = int(answer.session_lifetime_ms) if done else 0
        if done:
            problem = self._accept(lifetime)
            if problem is not None:
                self._count("principal_unknown", mechanism)
                return self._auth_failure(req, AUTH_FAILED, problem, "principal_unknown")
        reply = answers.authenticate(req.api_version, 0, None, server_bytes, lifetime)
        return Screened(resolved(reply))

    def _accept(self, lifetime_ms: int) -> str | None:
        """Authenticated: the principal, its access and the session expiry; or the reason the
        proxy cannot accept what the broker accepted."""
        claim = self._claim
        if claim is None:
            return (
                f"the kdelay proxy could not read the principal from the {self.mechanism} "
                f"exchange ({self._claim_error})"
            )
        if self.principal is not None and claim.principal != self.principal:
            return (
                f"Cannot change principals during re-authentication from {self.principal}: "
                f"{claim.principal}"
            )
        assert self._link is not None
        reauth = self._reauthenticating
        self.principal = claim.principal
        self.phase = Phase.AUTHENTICATED
        self._reauthenticating = False
        now = self.settings.clock()
        self.expires_at = now + lifetime_ms / 1000 if lifetime_ms > 0 else None
        if self.access is None:
            self.access = TopicAccess(claim.principal, self._link, self.settings.cache)
        kind = "reauthentication" if reauth else "login"
        mechanism = metric_labels.mechanism(self.mechanism, self.settings.mechanisms)
        self.metrics.authentications.labels(mechanism, kind).inc()
        log.info(
            "proxy.sasl_authenticated",
            principal=str(claim.principal),
            mechanism=self.mechanism,
            peer=self.address,
            reauthentication=reauth,
            session_lifetime_ms=lifetime_ms,
            delegation_token=claim.delegation_token,
        )
        return None

    # -- answers ----------------------------------------------------------------------------

    def _auth_failure(
        self, req: p.Request, code: int, message: str | None, reason: str
    ) -> Screened:
        return self._fail_reply(
            answers.authenticate(req.api_version, code, message),
            "proxy.sasl_authentication_failed",
            {"mechanism": self.mechanism, "reason": reason, "error": message},
        )

    def _refuse(self, req: p.Request, why: str, *, close: bool) -> Screened:
        """ILLEGAL_SASL_STATE for a SASL request out of order."""
        self.failed("illegal_state")
        reply = answers.illegal_state(req, why, self.settings.mechanisms)
        if not close:
            return Screened(resolved(reply))
        return self._fail_reply(reply, "proxy.sasl_illegal_state", {"why": why})

    def _fail_reply(self, reply: Reply, event: str, fields: Mapping[str, object]) -> Screened:
        """A failure's answer, after this address's login backoff; then close."""
        delay = self.settings.backoff.failed(self.address)
        return Screened(_later(delay, reply), event, {**fields, "delay_s": round(delay, 3)})

    def _link_lost(self, exc: LinkError | LoginsBusyError, mechanism: str) -> Screened:
        """The broker cannot be asked: close unanswered, so the client retries as after any
        network failure (Kafka has no error for 'the authenticator is unreachable')."""
        self._count("upstream_unavailable", mechanism)
        return Screened(None, "proxy.sasl_upstream_unavailable", {"error": str(exc)})

    # -- helpers ----------------------------------------------------------------------------

    def _count(self, reason: str, mechanism: str | None) -> None:
        """Count a failure; the labels from closed sets (proxy/metric_labels.py): the mechanism
        a client names is its own input."""
        self.metrics.auth_failures.labels(
            metric_labels.mechanism(mechanism, self.settings.mechanisms),
            metric_labels.auth_reason(reason),
        ).inc()

    def _who(self) -> dict[str, object]:
        return {"principal": str(self.principal), "mechanism": self.mechanism}


def _later(delay_s: float, reply: Reply) -> Awaitable[Reply]:
    """``reply``, once ``delay_s`` has passed (a task: the reader goes on meanwhile)."""
    if delay_s <= 0:
        return resolved(reply)

    async def wait() -> Reply:
        await asyncio.sleep(delay_s)
        return reply

    return asyncio.get_running_loop().create_task(wait())
