"""Bearer JWTs of the HTTP API, validated against a JWKS file (``http_jwks_file``).

The HTTP API accepts ``Authorization: Bearer <JWT>`` as Kafka's OAUTHBEARER accepts the same
token: signed by a key of the JSON Web Key Set (RFC 7517) in the file, not expired (``exp`` is
required), not before its ``nbf``, and carrying the principal claim (``sasl_principal_claim``,
``sub`` by default, as Kafka's ``sasl.oauthbearer.sub.claim.name``). The principal is then
``User:<claim>``, Kafka's form. PyJWT (with ``cryptography``) checks the signature and the
times; only asymmetric algorithms are accepted (a JWKS publishes public keys: ``none`` and the
HMAC ones never validate here). A token's ``kid`` picks its key; a token without one is tried
only against a set of exactly one key. ``http_jwt_audience``, when set, must be in ``aud``.

The file is read again when it changes (its modification time or size), so a rotated key set is
used without a restart; a file that became unreadable or invalid keeps the last good set and is
logged once per change.

The token is a secret: it is never logged, and no error message quotes it.

Concurrency: used from the asyncio loop only (no locks); validation is CPU work of a few
hundred microseconds (an RSA or EC signature), done inline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jwt

from kdelay import logs
from kdelay.errors import KdelayError

log = logs.get(__name__)

#: The algorithms a token may be signed with: public-key ones only.
ALGORITHMS: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)

#: Every algorithm JWA names (RFC 7518, RFC 8037): the only ``alg`` values an error quotes.
_KNOWN_ALGORITHMS: Final = ALGORITHMS | {"HS256", "HS384", "HS512", "none", "ES256K"}


class InvalidTokenError(KdelayError):
    """The bearer token does not validate; the message says why, never quoting the token."""


class JwksFileError(KdelayError):
    """The JWKS file cannot be read or holds no usable key; the message names the file."""


@dataclass(frozen=True, slots=True)
class Validated:
    """A valid token's principal (``User:<claim>``) and its expiry (epoch seconds)."""

    principal: str
    expires_at: float


def load_key_set(path: Path) -> jwt.PyJWKSet:
    """The key set in ``path``; raises JwksFileError naming the file and the problem."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise JwksFileError(
            f"http_jwks_file {str(path)!r} cannot be read: {exc.strerror}"
        ) from None
    try:
        keys = jwt.PyJWKSet.from_json(text)
    except (jwt.PyJWKSetError, jwt.PyJWKError, ValueError) as exc:
        raise JwksFileError(f"http_jwks_file {str(path)!r} is not a usable JWKS: {exc}") from None
    return keys


class JwksFile:
    """Validates bearer tokens against the keys of one JWKS file (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        principal_claim: str = "sub",
        *,
        audience: str | None = None,
    ) -> None:
        self.path = path
        self.principal_claim = principal_claim
        self.audience = audience
        self._stamp = self._file_stamp()
        self._keys = load_key_set(path)

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def keys(self) -> jwt.PyJWKSet:
        """The key set, read again when the file changed (the last good one if it broke)."""
        stamp = self._file_stamp()
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                self._keys = load_key_set(self.path)
                log.info("proxy.jwks_reloaded", file=str(self.path), keys=len(self._keys.keys))
            except JwksFileError as exc:
                log.warning("proxy.jwks_unusable", file=str(self.path), error=str(exc))
        return self._keys

    def validate(self, token: str) -> Validated:
        """The principal of a valid ``token``; raises InvalidTokenError saying why not."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise InvalidTokenError("the bearer token is not a JWT") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            # The token is the client's text: its alg is named only when it is a known one.
            named = repr(alg) if alg in _KNOWN_ALGORITHMS else "(alg)"
            raise InvalidTokenError(
                f"the bearer token's algorithm {named} is not accepted (one of "
                f"{', '.join(sorted(ALGORITHMS))})"
            )
        key = self._key(header.get("kid"))
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self.audience,
                options={"require": ["exp"], "verify_aud": self.audience is not None},
                leeway=0,
            )
        except jwt.ExpiredSignatureError:
            raise InvalidTokenError("the bearer token has expired (exp)") from None
        except jwt.ImmatureSignatureError:
            raise InvalidTokenError("the bearer token is not valid yet (nbf)") from None
        except jwt.InvalidSignatureError:
            raise InvalidTokenError(
                "the bearer token's signature does not verify with http_jwks_file's key"
            ) from None
        except jwt.MissingRequiredClaimError as exc:
            raise InvalidTokenError(f"the bearer token has no {exc.claim!r} claim") from None
        except jwt.InvalidAudienceError:
            raise InvalidTokenError(
                f"the bearer token's aud does not name {self.audience!r} (http_jwt_audience)"
            ) from None
        except (jwt.InvalidTokenError, jwt.PyJWKError, ValueError, TypeError) as exc:
            raise InvalidTokenError(f"the bearer token is invalid: {type(exc).__name__}") from None
        name = claims.get(self.principal_claim)
        if not isinstance(name, str) or not name:
            raise InvalidTokenError(
                f"the bearer token has no {self.principal_claim!r} claim (sasl_principal_claim)"
            )
        return Validated(f"User:{name}", float(claims["exp"]))

    def _key(self, kid: object) -> jwt.PyJWK:
        keys = self.keys()
        if kid is None:
            if len(keys.keys) == 1:
                return keys.keys[0]
            raise InvalidTokenError(
                "the bearer token names no key (kid) and http_jwks_file holds several"
            )
        if not isinstance(kid, str):
            raise InvalidTokenError("the bearer token's kid is not a string")
        for key in keys.keys:
            if key.key_id == kid:
                return key
        raise InvalidTokenError("no key of http_jwks_file has the bearer token's kid")
