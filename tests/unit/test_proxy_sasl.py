"""The pieces of SASL at the proxy that need no connection: reading the principal from each
mechanism's first token and knowing when an exchange is complete (proxy/sasl.py), the failed-login
backoff per address (proxy/auth/login_backoff.py) and the ACL cache
(proxy/auth/authorization.py)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kdelay.proxy import sasl
from kdelay.proxy.auth.authorization import Access, AclCache
from kdelay.proxy.auth.login_backoff import LoginBackoff
from kdelay.proxy.sasl import Principal
from tests.support.fakes import FakeClock


def _jwt(claims: dict[str, object]) -> str:
    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    header = b64(json.dumps({"alg": "none"}).encode())
    return f"{header}.{b64(json.dumps(claims).encode())}."


def _oauth(token: str, authzid: str = "") -> bytes:
    header = f"n,a={authzid}," if authzid else "n,,"
    return f"{header}\x01auth=Bearer {token}\x01\x01".encode()


def test_plain_names_the_authcid_and_refuses_another_authzid() -> None:
    assert sasl.claim(sasl.PLAIN, b"\0alice\0secret").principal == Principal("alice")
    assert sasl.claim(sasl.PLAIN, b"alice\0alice\0secret").principal == Principal("alice")
    assert str(sasl.claim(sasl.PLAIN, b"\0alice\0s").principal) == "User:alice"
    for bad in (b"alice\0secret", b"bob\0alice\0secret", b"\0\0secret", b"\0\xff\0x"):
        with pytest.raises(sasl.SaslTokenError):
            sasl.claim(sasl.PLAIN, bad)


def test_scram_unescapes_the_user_name_and_sees_delegation_tokens() -> None:
    first = b"n,,n=al=2Cice=3D,r=fyko+d2lbbFgONRv9qkxdawL"
    for mech in (sasl.SCRAM_SHA_256, sasl.SCRAM_SHA_512):
        assert sasl.claim(mech, first) == sasl.Claim(Principal("al,ice="))
    claim = sasl.claim(sasl.SCRAM_SHA_512, b"n,,n=tokenid,r=abc,tokenauth=true")
    assert claim.delegation_token
    assert sasl.claim(sasl.SCRAM_SHA_512, b"n,a=bob,n=bob,r=x").principal == Principal("bob")
    for bad in (
        b"n,,n=a=2Xb,r=x",  # an escape RFC 5802 does not define
        b"n,a=eve,n=bob,r=x",  # authzid of another user
        b"n,,m=ext,n=bob,r=x",  # reserved mandatory extension
        b"n,,n=,r=x",
        b"p=tls-unique,,n=bob,r=x",  # channel binding: Kafka has none
        b"garbage",
    ):
        with pytest.raises(sasl.SaslTokenError):
            sasl.claim(sasl.SCRAM_SHA_256, bad)


def test_oauthbearer_names_the_principal_claim() -> None:
    token = _jwt({"sub": "alice", "upn": "alice@example.org", "exp": 2_000_000_000})
    assert sasl.claim(sasl.OAUTHBEARER, _oauth(token)).principal == Principal("alice")
    upn = sasl.claim(sasl.OAUTHBEARER, _oauth(token), principal_claim="upn")
    assert upn.principal == Principal("alice@example.org")
    assert sasl.claim(sasl.OAUTHBEARER, _oauth(token, "alice")).principal.name == "alice"
    for bad in (
        _oauth(token, "mallory"),
        _oauth(_jwt({"scope": "x"})),
        _oauth("not-a-jwt"),
        _oauth("a.%%%.b"),
        b"\x01",  # the client's answer to an error challenge
    ):
        with pytest.raises(sasl.SaslTokenError):
            sasl.claim(sasl.OAUTHBEARER, bad)


def test_when_each_exchange_is_complete() -> None:
    assert sasl.complete(sasl.PLAIN, 0, b"")
    assert not sasl.complete(sasl.SCRAM_SHA_512, 0, b"r=abc,s=salt,i=4096")
    assert sasl.complete(sasl.SCRAM_SHA_512, 1, b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=")
    assert not sasl.complete(sasl.SCRAM_SHA_256, 1, b"e=invalid-proof")
    assert sasl.complete(sasl.OAUTHBEARER, 0, b"")
    assert not sasl.complete(sasl.OAUTHBEARER, 0, b'{"status":"invalid_token"}')
    assert not sasl.complete("GSSAPI", 0, b"")


@given(st.sampled_from(sasl.MECHANISMS), st.binary(max_size=300))
def test_any_token_is_read_or_refused_with_a_token_error(mechanism: str, token: bytes) -> None:
    try:
        name = sasl.claim(mechanism, token).principal.name
    except sasl.SaslTokenError:
        return
    assert name


def test_login_backoff_doubles_per_address_up_to_its_cap_and_forgets_quiet_ones() -> None:
    clock = FakeClock()
    backoff = LoginBackoff(0.1, 1.0, quiet_s=60, max_addresses=2, clock=clock.monotonic)
    assert [backoff.failed("10.0.0.1") for _ in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.failed("10.0.0.2") == 0.1  # another address is not slowed down
    clock.advance(61)
    assert backoff.failures("10.0.0.1") == 0
    assert backoff.failed("10.0.0.1") == 0.1
    backoff.failed("10.0.0.3")  # a third address: the least recently failed is forgotten
    assert backoff.failures("10.0.0.2") == 0
    assert LoginBackoff(0, 5).failed("x") == 0.0


def test_acl_cache_keeps_an_answer_for_its_ttl_and_at_most_its_entries() -> None:
    clock = FakeClock()
    cache = AclCache(5.0, max_entries=2, clock=clock.monotonic)
    alice, bob = Principal("alice"), Principal("bob")
    cache.put(alice, "t", Access(0, frozenset({4})))
    assert cache.get(alice, "t") == Access(0, frozenset({4}))
    assert cache.get(bob, "t") is None  # per principal
    clock.advance(5.0)
    assert cache.get(alice, "t") is None
    for topic in ("a", "b", "c"):
        cache.put(alice, topic, Access(29))
    assert len(cache) == 2
    assert cache.get(alice, "a") is None
    off = AclCache(0)
    off.put(alice, "t", Access(0))
    assert off.get(alice, "t") is None


def test_only_an_answer_with_the_write_bit_allows_writing() -> None:
    assert Access(0, frozenset({4, 8})).writable
    assert not Access(0, frozenset({3, 8})).writable  # READ and DESCRIBE
    assert not Access(0, None).writable
    assert not Access(29).writable
