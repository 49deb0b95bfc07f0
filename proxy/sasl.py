"""SASL mechanisms as the proxy sees them while relaying a client's exchange to Kafka.

The proxy never judges credentials: Kafka does, on a connection of the proxy's own
(proxy/kafka/auth_session.py relays every token both ways). What the proxy needs from the exchange
is (1) the principal Kafka authenticated, read from the client's first token, and (2) when the
exchange is complete, because a SaslAuthenticate response without an error does not say whether
more rounds follow:

- PLAIN (RFC 4616): one round, ``authzid NUL authcid NUL password``; the principal is the
  authcid (Kafka refuses an authzid other than the authcid).
- SCRAM-SHA-256/512 (RFC 5802, KIP-84): ``client-first`` then ``client-final``; the principal
  is the ``n=`` of client-first, ``=2C`` and ``=3D`` unescaped; complete when the broker's
  answer is the server-final message (``v=...``). A delegation token (KIP-48, the extension
  ``tokenauth=true``) authenticates as the token's owner, which the exchange does not name:
  ``Claim.delegation_token`` says so and the principal is then the token id.
- OAUTHBEARER (RFC 7628, KIP-255): the initial response carries ``auth=Bearer <JWT>``; the
  principal is the token's claim named by the broker's principal claim setting (``sub`` by
  default). Complete when the broker answers with no bytes; a non-empty answer is the error
  challenge, and the client's next (empty) round is refused by the broker.

Pure functions, no I/O. A token carries secrets (a password, a bearer token): only the name is
taken from it, nothing of it is kept or logged.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Final

import orjson

from kdelay.errors import KdelayError

PLAIN: Final = "PLAIN"
SCRAM_SHA_256: Final = "SCRAM-SHA-256"
SCRAM_SHA_512: Final = "SCRAM-SHA-512"
OAUTHBEARER: Final = "OAUTHBEARER"
#: The mechanisms the proxy can relay, in Kafka's spelling.
MECHANISMS: Final = (SCRAM_SHA_512, SCRAM_SHA_256, PLAIN, OAUTHBEARER)
SCRAM: Final = frozenset({SCRAM_SHA_256, SCRAM_SHA_512})


class SaslTokenError(KdelayError):
    """A client's SASL token cannot be read (the broker judges it anyway)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """A Kafka principal, ``User:<name>`` for every SASL mechanism here."""

    name: str
    type: str = "User"

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"


@dataclass(frozen=True, slots=True)
class Claim:
    """Who the client's first token says it is."""

    principal: Principal
    #: A SCRAM delegation token: Kafka authenticates the token's owner, not ``principal``.
    delegation_token: bool = False


def claim(mechanism: str, first_token: bytes, *, principal_claim: str = "sub") -> Claim:
    """The principal named by a client's first token; raises SaslTokenError."""
    if mechanism == PLAIN:
        return Claim(Principal(_plain_authcid(first_token)))
    if mechanism in SCRAM:
        name, token = _scram_username(first_token)
        return Claim(Principal(name), delegation_token=token)
    if mechanism == OAUTHBEARER:
        return Claim(Principal(_oauth_subject(first_token, principal_claim)))
    raise SaslTokenError(f"mechanism {mechanism} is not relayed by the proxy")


def complete(mechanism: str, round_index: int, server_bytes: bytes) -> bool:
    """Whether a successful SaslAuthenticate answer (round ``round_index``, from 0) ends the
    exchange."""
    if mechanism == PLAIN:
        return True
    if mechanism in SCRAM:
        return round_index >= 1 and server_bytes.startswith(b"v=")
    if mechanism == OAUTHBEARER:
        return not server_bytes
    return False


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslTokenError(f"{what} is not UTF-8") from None


def _plain_authcid(token: bytes) -> str:
    parts = token.split(b"\0")
    if len(parts) != 3:
        raise SaslTokenError("PLAIN token is not authzid NUL authcid NUL password")
    authzid, authcid = _text(parts[0], "PLAIN authzid"), _text(parts[1], "PLAIN authcid")
    if not authcid:
        raise SaslTokenError("PLAIN token has an empty authcid")
    if authzid and authzid != authcid:
        raise SaslTokenError("PLAIN authzid differs from the authcid")
    return authcid


def _scram_username(token: bytes) -> tuple[str, bool]:
    """The user name and whether it is a delegation token, from a SCRAM client-first message:
    ``gs2-cbind-flag "," [authzid] "," "n=" saslname "," "r=" nonce ["," extensions]``."""
    fields = _text(token, "SCRAM client-first message").split(",")
    if len(fields) < 4 or fields[0] not in ("n", "y") or not fields[2].startswith("n="):
        raise SaslTokenError("not a SCRAM client-first message")
    name = _scram_unescape(fields[2][2:])
    if not name:
        raise SaslTokenError("SCRAM user name is empty")
    authzid = fields[1]
    if authzid and (not authzid.startswith("a=") or _scram_unescape(authzid[2:]) != name):
        raise SaslTokenError("SCRAM authzid differs from the user name")
    extensions = {f.partition("=")[0]: f.partition("=")[2] for f in fields[4:]}
    return name, extensions.get("tokenauth", "").lower() == "true"


def _scram_unescape(saslname: str) -> str:
    """RFC 5802's saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` is invalid."""
    out, i = [], 0
    while i < len(saslname):
        c = saslname[i]
        if c == "=":
            escape = saslname[i : i + 3]
            if escape not in ("=2C", "=3D"):
                raise SaslTokenError("SCRAM user name has an invalid '=' escape")
            out.append("," if escape == "=2C" else "=")
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _oauth_subject(token: bytes, principal_claim: str) -> str:
    """The principal claim of the bearer token in an OAUTHBEARER initial client response:
    ``gs2-header %x01 *(key "=" value %x01) %x01``."""
    text = _text(token, "OAUTHBEARER client response")
    header, sep, rest = text.partition("\x01")
    if not sep or not header.startswith(("n,", "y,")):
        raise SaslTokenError("not an OAUTHBEARER initial client response")
    pairs = dict(kv.partition("=")[::2] for kv in rest.split("\x01") if kv)
    scheme, _, jwt = pairs.get("auth", "").partition(" ")
    if scheme.lower() != "bearer" or jwt.count(".") != 2:
        raise SaslTokenError("OAUTHBEARER response carries no bearer JWT")
    payload = jwt.split(".")[1]
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (binascii.Error, ValueError):
        raise SaslTokenError("OAUTHBEARER token's claims are not base64url JSON") from None
    subject = claims.get(principal_claim) if isinstance(claims, dict) else None
    if not isinstance(subject, str) or not subject:
        raise SaslTokenError(f"OAUTHBEARER token has no {principal_claim!r} claim")
    authzid = header.split(",")[1]
    if authzid and authzid != f"a={subject}":
        raise SaslTokenError("OAUTHBEARER authzid differs from the token's principal")
    return subject
