"""An HTTP request's credentials: its ``Authorization`` header read as RFC 7617 Basic or RFC
6750 Bearer (proxy/http/login.py checks them with Kafka). Neither kind's repr shows its secret,
and an unreadable header's error quotes nothing of it (a registered scheme's name at most)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Final

from kdelay.errors import KdelayError

#: IANA's HTTP Authentication Scheme Registry (besides Basic and Bearer), by lower-case name:
#: the only schemes an error names.
_SCHEMES: Final = {
    s.lower(): s
    for s in (
        "Concealed", "Digest", "DPoP", "GNAP", "HOBA", "Mutual", "Negotiate", "OAuth",
        "PrivateToken", "SCRAM-SHA-1", "SCRAM-SHA-256", "vapid",
    )
}  # fmt: skip


class MalformedCredentialsError(KdelayError, ValueError):
    """The ``Authorization`` header cannot be read; the message says why, quoting nothing."""


@dataclass(frozen=True, slots=True, repr=False)
class Basic:
    """``Authorization: Basic`` credentials (repr hides the password)."""

    username: str
    password: str

    def __repr__(self) -> str:
        return f"Basic(username={self.username!r})"


@dataclass(frozen=True, slots=True, repr=False)
class Bearer:
    """``Authorization: Bearer`` credentials (repr hides the token)."""

    token: str

    def __repr__(self) -> str:
        return "Bearer(...)"


def parse_authorization(value: str | None) -> Basic | Bearer | None:
    """The credentials of an ``Authorization`` header (RFC 7617 Basic, RFC 6750 Bearer), None
    when there is none; raises MalformedCredentialsError. Schemes are case-insensitive."""
    if value is None or not value.strip():
        return None
    scheme, _, rest = value.strip().partition(" ")
    rest = rest.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise MalformedCredentialsError(
                "the Basic credentials are not base64 of UTF-8 text"
            ) from None
        username, colon, password = decoded.partition(":")
        if not colon or not username:
            raise MalformedCredentialsError("the Basic credentials are not user:password")
        return Basic(username, password)
    if scheme.lower() == "bearer":
        if not rest or " " in rest:
            raise MalformedCredentialsError("the Bearer credentials are not one token")
        return Bearer(rest)
    # The header is the client's text, never written into a log or a response: a
    # scheme is named only when it is a registered one, in the registry's spelling.
    known = _SCHEMES.get(scheme.lower())
    named = f"scheme {known!r}" if known else "scheme"
    raise MalformedCredentialsError(f"the Authorization {named} is not accepted (Basic or Bearer)")
