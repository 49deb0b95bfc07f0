"""Signing keys and a JWKS file for the bearer-token tests (the HTTP API, Kafka's OAUTHBEARER).

:class:`SigningKey` is an RSA key pair made with ``cryptography``; :func:`write_jwks` writes the
public halves of some keys as a JWKS file (RFC 7517) for ``http_jwks_file`` and Kafka's
``sasl.oauthbearer.jwks.endpoint.url``; :meth:`SigningKey.token` signs a JWT with PyJWT.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa


@dataclass
class SigningKey:
    """An RSA key (RS256) with its key id."""

    kid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    private: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    def jwk(self) -> dict[str, Any]:
        """The public key as a JWK."""
        found: dict[str, Any] = json.loads(
            jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key())
        )
        return {**found, "kid": self.kid, "alg": "RS256", "use": "sig"}

    def token(self, sub: str, *, ttl_s: float = 300, kid: str | None = "", **claims: Any) -> str:
        """A JWT for ``sub`` expiring in ``ttl_s`` (negative: already expired), signed RS256;
        ``kid`` None leaves the header's kid out, "" uses this key's."""
        now = int(time.time())
        body = {"sub": sub, "iat": now, "exp": now + int(ttl_s), **claims}
        headers = {} if kid is None else {"kid": kid or self.kid}
        return jwt.encode(body, self.private, algorithm="RS256", headers=headers)


def write_jwks(path: Path, *keys: SigningKey) -> Path:
    """A JWKS file at ``path`` holding the public halves of ``keys``."""
    path.write_text(json.dumps({"keys": [k.jwk() for k in keys]}))
    return path
