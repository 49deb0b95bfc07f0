"""proxy/auth/jwks.py: bearer JWTs validated against a JWKS file, as Kafka's OAUTHBEARER validator
does: the signature of a key in the file, exp required, nbf, the principal claim; asymmetric
algorithms only; the file read again when it changes."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest

from kdelay.proxy.auth.jwks import InvalidTokenError, JwksFile, JwksFileError
from tests.support.jwt_keys import SigningKey, write_jwks


def _unsigned(claims: dict[str, Any]) -> str:
    """A JWT with ``alg: none`` (PyJWT refuses to make one)."""

    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}."


@pytest.fixture(scope="module")
def keys() -> tuple[SigningKey, SigningKey]:
    return SigningKey(), SigningKey()


def test_a_token_signed_by_a_key_of_the_file_names_its_principal(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    one, two = keys
    jwks = JwksFile(write_jwks(tmp_path / "jwks.json", one, two))
    valid = jwks.validate(two.token("alice", ttl_s=60))
    assert valid.principal == "User:alice"
    assert time.time() < valid.expires_at <= time.time() + 61


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("expired", "has expired"),
        ("not_yet", "not valid yet"),
        ("other_key", "no key of http_jwks_file has"),
        ("forged_kid", "signature does not verify"),
        ("no_exp", "no 'exp' claim"),
        ("no_sub", "no 'sub' claim"),
        ("hmac", "algorithm 'HS256' is not accepted"),
        ("unsigned", "algorithm 'none' is not accepted"),
        ("garbage", "not a JWT"),
    ],
)
def test_an_invalid_token_is_refused_saying_why_without_quoting_it(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey], case: str, why: str
) -> None:
    good, other = keys
    jwks = JwksFile(write_jwks(tmp_path / "jwks.json", good))
    now = int(time.time())
    makers: dict[str, Callable[[], str]] = {
        "expired": lambda: good.token("alice", ttl_s=-10),
        "not_yet": lambda: good.token("alice", nbf=now + 600),
        "other_key": lambda: other.token("alice"),
        # signed by another key but claiming to be the good one's
        "forged_kid": lambda: other.token("alice", kid=good.kid),
        "no_exp": lambda: jwt.encode({"sub": "alice"}, good.private, "RS256", {"kid": good.kid}),
        "no_sub": lambda: jwt.encode({"exp": now + 60}, good.private, "RS256", {"kid": good.kid}),
        "hmac": lambda: jwt.encode({"sub": "a", "exp": now + 60}, "k" * 32, "HS256"),
        "unsigned": lambda: _unsigned({"sub": "a", "exp": now + 60}),
        "garbage": lambda: "not-a-token",
    }
    token = makers[case]()
    with pytest.raises(InvalidTokenError, match=why) as refused:
        jwks.validate(token)
    assert token not in str(refused.value)


def test_the_principal_claim_and_the_audience_are_settings(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    key = keys[0]
    path = write_jwks(tmp_path / "jwks.json", key)
    jwks = JwksFile(path, "preferred_username", audience="kafka")
    token = key.token("s-123", preferred_username="bob", aud="kafka")
    assert jwks.validate(token).principal == "User:bob"
    with pytest.raises(InvalidTokenError, match="http_jwt_audience"):
        jwks.validate(key.token("s-123", preferred_username="bob", aud="other"))


def test_a_token_without_kid_needs_a_file_of_one_key(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    one, two = keys
    token = one.token("alice", kid=None)
    assert JwksFile(write_jwks(tmp_path / "one.json", one)).validate(token).principal
    with pytest.raises(InvalidTokenError, match="names no key"):
        JwksFile(write_jwks(tmp_path / "two.json", one, two)).validate(token)


def test_a_rotated_file_is_read_again_and_a_broken_one_keeps_the_last_good_keys(
    tmp_path: Path, keys: tuple[SigningKey, SigningKey]
) -> None:
    old, new = keys
    path = write_jwks(tmp_path / "jwks.json", old)
    jwks = JwksFile(path)
    with pytest.raises(InvalidTokenError):
        jwks.validate(new.token("alice"))
    write_jwks(path, new)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    assert jwks.validate(new.token("alice")).principal == "User:alice"
    path.write_text("{not json")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2_000_000))
    assert jwks.validate(new.token("alice")).principal == "User:alice"


def test_an_unusable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(JwksFileError, match="cannot be read"):
        JwksFile(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"keys": []}')
    with pytest.raises(JwksFileError, match=r"bad\.json' is not a usable JWKS"):
        JwksFile(tmp_path / "bad.json")
