"""An HTTP request's credentials: its ``Authorization`` header read as RFC 7617 Basic or RFC
6750 Bearer (proxy/http_login.py checks them with Kafka). Neither kind's repr shows its secret,
and an unreadable header's error quotes nothing of it."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass


class MalformedCredentialsError(ValueError):
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
    raise MalformedCredentialsError(
        f"the Authorization scheme {scheme[:32]!r} is not accepted (Basic or Bearer)"
    )
