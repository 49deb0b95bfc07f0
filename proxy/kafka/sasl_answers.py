"""The SASL responses the proxy sends itself (proxy/kafka/auth_session.py relays the broker's
otherwise).

Each is built at the client's request version with kafka-python's generated classes, and
returned as a ``Reply`` labelled with its error for the request metrics.

After a SaslHandshake v0 (KIP-43's original framing, which Kafka 4 still takes) the client sends
its SASL tokens bare: size-prefixed, without a request header. The listener
(proxy/kafka/connection.py) hands each to the session as the SaslAuthenticate v0 it stands for
(:func:`bare_token_request`), which the session relays like any round, and answers with the
broker's token bare again (:func:`bare_token_reply`); a failure is not answered and the
connection closes, as Kafka closes it.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Sequence
from typing import Final

import kafka.errors as kerr
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeResponse,
)

from kdelay.proxy.kafka.broker import Reply
from kdelay.proxy.wire import protocol as p

ILLEGAL_STATE: Final = kerr.IllegalSaslStateError.errno


def handshake(version: int, code: int, mechanisms: Sequence[str]) -> Reply:
    """A SaslHandshake response: ``code`` (0: accepted) and the mechanisms on offer."""
    response = SaslHandshakeResponse(error_code=code, mechanisms=list(mechanisms), version=version)
    return Reply(response, p.error_name(code) if code else "ok")


def authenticate(
    version: int,
    code: int = 0,
    message: str | None = None,
    auth_bytes: bytes = b"",
    session_lifetime_ms: int = 0,
) -> Reply:
    """A SaslAuthenticate response (``session_lifetime_ms`` is sent from v1, KIP-368)."""
    response = SaslAuthenticateResponse(
        error_code=code,
        error_message=message,
        auth_bytes=auth_bytes,
        session_lifetime_ms=session_lifetime_ms,
        version=version,
    )
    return Reply(response, p.error_name(code) if code else "ok")


def illegal_state(req: p.Request, why: str, mechanisms: Sequence[str] = ()) -> Reply:
    """ILLEGAL_SASL_STATE for a SASL request out of order (``why`` in SaslAuthenticate's
    message; a SaslHandshake response has no message field)."""
    if req.api_key == p.SASL_HANDSHAKE:
        return handshake(req.api_version, ILLEGAL_STATE, mechanisms)
    return authenticate(req.api_version, ILLEGAL_STATE, why)


def sasl_disabled(req: p.Request) -> Reply:
    """The answer to a SASL request on a listener without SASL: ILLEGAL_SASL_STATE, as Kafka
    answers one on a PLAINTEXT or SSL listener (the connection stays open)."""
    why = "the kdelay proxy's listener does not speak SASL (listener_security_protocol)"
    return illegal_state(req, why)


def bare_tokens_follow(req: p.Request, exchanging: bool, bare: bool) -> bool:
    """Whether the client's next frame is a bare token: in an exchange (``exchanging``) that a
    SaslHandshake v0 began (``req``), or that bare tokens carry on (``bare``)."""
    v0_handshake = req.api_key == p.SASL_HANDSHAKE and req.api_version == 0
    return exchanging and (bare or v0_handshake)


def bare_token_request(token: bytes) -> p.Request:
    """A bare token, as the SaslAuthenticate v0 it stands for (no correlation id)."""
    body = SaslAuthenticateRequest(auth_bytes=token, version=0)
    return p.Request(p.SASL_AUTHENTICATE, 0, -1, None, body)


async def bare_token_reply(reply: Awaitable[Reply]) -> Reply:
    """The session's SaslAuthenticate answer as a bare token; nothing on an error (the
    connection then closes)."""
    answer = await reply
    response = answer.response
    if response is None or response.error_code:
        return Reply(result=answer.result)
    token = bytes(response.auth_bytes)
    return Reply(result=answer.result, frame=struct.pack(">i", len(token)) + token)
