"""The SASL responses the proxy sends itself (proxy/auth_session.py relays the broker's otherwise).

Each is built at the client's request version with kafka-python's generated classes, and
returned as a ``Reply`` labelled with its error for the request metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import kafka.errors as kerr
from kafka.protocol.sasl import SaslAuthenticateResponse, SaslHandshakeResponse

from proxy import protocol as p
from proxy.broker import Reply

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
