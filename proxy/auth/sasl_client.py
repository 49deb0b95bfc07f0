"""The proxy as a SASL *client*: log in to Kafka on a link with credentials the HTTP API got.

The Kafka listener relays a client's own SASL exchange (proxy/kafka/auth_session.py); the HTTP API
has no exchange to relay, only an ``Authorization`` header, so the proxy runs the exchange itself on
a link of its own (proxy/auth/broker_link.py) and Kafka judges the credentials as for any client:

- PLAIN (RFC 4616): one SaslAuthenticate, ``NUL user NUL password``.
- SCRAM-SHA-256/512 (RFC 5802, KIP-84): client-first, client-final, and the server's signature
  checked, computed by ``scramp`` (a maintained SCRAM implementation; no hand-rolled crypto
  here). scramp applies SASLprep to the user name and password, which leaves ASCII unchanged;
  Kafka's own clients do not, so a non-ASCII password that SASLprep changes cannot log in here.
- OAUTHBEARER (RFC 7628, KIP-255): the initial response ``n,,\\x01auth=Bearer <JWT>\\x01\\x01``; a
  non-empty answer is Kafka's error challenge, acknowledged with ``\\x01`` as RFC 7628 asks.

A refusal raises :class:`LoginRefusedError` with Kafka's own message; a link failure raises
``LinkError``. The secrets are never logged or put in an error message.

Concurrency: one login per link, on the asyncio loop (SCRAM's PBKDF2 in a worker thread); the
link serialises its requests.
"""

from __future__ import annotations

import asyncio
from typing import Final

import kafka.errors as kerr
import orjson
import scramp
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from kdelay.errors import KdelayError
from kdelay.proxy import sasl
from kdelay.proxy.auth.broker_link import Link

#: The SaslHandshake version (v1: SaslAuthenticate requests follow, KIP-152) and the
#: SaslAuthenticate version (v1: the session lifetime, KIP-368).
HANDSHAKE_VERSION: Final = 1
AUTHENTICATE_VERSION: Final = 1
#: The mechanisms the proxy can log in with for the HTTP API.
MECHANISMS: Final = (sasl.SCRAM_SHA_512, sasl.SCRAM_SHA_256, sasl.PLAIN, sasl.OAUTHBEARER)


class LoginRefusedError(KdelayError):
    """Kafka refused the login: ``reason`` is a metric label, the message is Kafka's."""

    def __init__(self, message: str, reason: str = "invalid_credentials") -> None:
        super().__init__(message)
        self.reason = reason


async def login(link: Link, mechanism: str, username: str, secret: str) -> int:
    """Log in to Kafka on ``link`` (connected, not yet authenticated) as ``username`` with
    ``secret`` (a password; for OAUTHBEARER the JWT, ``username`` unused); returns the session
    lifetime Kafka gave, in ms (0: none). Raises LoginRefusedError or LinkError."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism {mechanism} is not one of {', '.join(MECHANISMS)}")
    answer = await link.request(
        SaslHandshakeRequest(mechanism=mechanism, version=HANDSHAKE_VERSION)
    )
    if answer.error_code:
        offered = ", ".join(answer.mechanisms) or "none"
        raise LoginRefusedError(
            f"Kafka does not enable SASL mechanism {mechanism} on the proxy's upstream listener "
            f"(it offers {offered}); see http_sasl_mechanism",
            "unsupported_mechanism",
        )
    if mechanism == sasl.PLAIN:
        return await _plain(link, username, secret)
    if mechanism == sasl.OAUTHBEARER:
        return await _oauthbearer(link, secret)
    return await _scram(link, mechanism, username, secret)


async def _round(link: Link, token: bytes) -> tuple[bytes, int]:
    """One SaslAuthenticate: the server's bytes and the session lifetime (ms)."""
    answer = await link.request(
        SaslAuthenticateRequest(auth_bytes=token, version=AUTHENTICATE_VERSION)
    )
    if answer.error_code:
        reason = (
            "invalid_credentials"
            if answer.error_code == kerr.SaslAuthenticationFailedError.errno
            else "rejected"
        )
        raise LoginRefusedError(answer.error_message or f"Kafka error {answer.error_code}", reason)
    return bytes(answer.auth_bytes), int(answer.session_lifetime_ms)


async def _plain(link: Link, username: str, password: str) -> int:
    token = b"\0" + username.encode() + b"\0" + password.encode()
    _, lifetime = await _round(link, token)
    return lifetime


async def _scram(link: Link, mechanism: str, username: str, password: str) -> int:
    try:
        client = scramp.ScramClient([mechanism], username, password)
        first = client.get_client_first()
    except scramp.ScramException as exc:
        raise LoginRefusedError(f"the user name cannot be used with {mechanism}: {exc}") from None
    server_first, _ = await _round(link, first.encode())
    try:
        client.set_server_first(server_first.decode())
        # PBKDF2 with the iterations Kafka asks for (4,096 and up): in a worker thread, never
        # on the event loop (hashlib releases the GIL while it runs).
        final = await asyncio.to_thread(client.get_client_final)
    except (scramp.ScramException, UnicodeDecodeError) as exc:
        raise LoginRefusedError(
            f"Kafka's SCRAM server-first message is invalid: {exc}", "rejected"
        ) from None
    server_final, lifetime = await _round(link, final.encode())
    try:
        client.set_server_final(server_final.decode())
    except (scramp.ScramException, UnicodeDecodeError) as exc:
        raise LoginRefusedError(
            f"Kafka's SCRAM server signature is invalid: {exc}", "rejected"
        ) from None
    return lifetime


async def _oauthbearer(link: Link, token: str) -> int:
    initial = b"n,,\x01auth=Bearer " + token.encode() + b"\x01\x01"
    challenge, lifetime = await _round(link, initial)
    if not challenge:
        return lifetime
    # RFC 7628 3.2.3: the client answers an error challenge with %x01; the server then fails.
    try:
        await _round(link, b"\x01")
    except LoginRefusedError as exc:
        raise LoginRefusedError(f"{exc} ({_challenge_status(challenge)})") from None
    raise LoginRefusedError(f"Kafka refused the bearer token ({_challenge_status(challenge)})")


def _challenge_status(challenge: bytes) -> str:
    """The ``status`` of an OAUTHBEARER error challenge (RFC 7628 3.2.2: JSON), never the token."""
    try:
        status = orjson.loads(challenge).get("status")
    except (orjson.JSONDecodeError, AttributeError):
        status = None
    return f"status {str(status)[:64]}" if status else "status unknown"
