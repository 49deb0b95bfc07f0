"""proxy/auth/sasl_client.py: the proxy logging in to Kafka as a SASL client, against a broker link
that runs the server side of each mechanism (SCRAM with scramp's server, so the client's proof
and the server's signature are really computed and checked)."""

from __future__ import annotations

import asyncio
from typing import Any

import kafka.errors as kerr
import pytest
import scramp
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from kdelay.proxy.auth.sasl_client import LoginRefusedError, login

FAILED = kerr.SaslAuthenticationFailedError.errno
MESSAGE = "Authentication failed during authentication due to invalid credentials"


class ServerLink:
    """A link whose broker checks ``users`` (name -> password) with ``mechanisms``."""

    def __init__(self, users: dict[str, str], mechanisms: tuple[str, ...], **kw: Any) -> None:
        self.users = users
        self.mechanisms = mechanisms
        self.lifetime_ms = int(kw.get("lifetime_ms", 0))
        self.tokens: dict[str, bytes] = kw.get("tokens", {})
        self.mechanism = ""
        self.server: Any = None
        self.rounds: list[bytes] = []
        self.forged_signature = bool(kw.get("forged_signature", False))

    @property
    def open(self) -> bool:
        return True

    async def connect(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def request(self, req: Any) -> Any:
        if isinstance(req, SaslHandshakeRequest):
            ok = req.mechanism in self.mechanisms
            self.mechanism = req.mechanism
            return SaslHandshakeResponse(
                error_code=0 if ok else kerr.UnsupportedSaslMechanismError.errno,
                mechanisms=list(self.mechanisms),
                version=1,
            )
        assert isinstance(req, SaslAuthenticateRequest)
        token = bytes(req.auth_bytes)
        self.rounds.append(token)
        try:
            return self._answer(token)
        except scramp.ScramException:
            return self._auth(FAILED, MESSAGE)

    def _auth(self, code: int = 0, message: str | None = None, data: bytes = b"") -> Any:
        return SaslAuthenticateResponse(
            error_code=code,
            error_message=message,
            auth_bytes=data,
            session_lifetime_ms=self.lifetime_ms if not code else 0,
            version=1,
        )

    def _answer(self, token: bytes) -> Any:
        if self.mechanism == "PLAIN":
            _, user, password = token.split(b"\0")
            ok = self.users.get(user.decode()) == password.decode()
            return self._auth() if ok else self._auth(FAILED, MESSAGE)
        if self.mechanism == "OAUTHBEARER":
            if token == b"\x01":
                return self._auth(FAILED, "OAUTHBEARER: invalid token")
            good = token in {b"n,,\x01auth=Bearer " + t + b"\x01\x01" for t in self.tokens.values()}
            return self._auth() if good else self._auth(data=b'{"status":"invalid_token"}')
        mech = scramp.ScramMechanism(self.mechanism)
        if self.server is None:
            infos = {u: mech.make_auth_info(p, iteration_count=4096) for u, p in self.users.items()}
            self.server = mech.make_server(lambda user: infos[user])
            self.server.set_client_first(token.decode())
            return self._auth(data=self.server.get_server_first().encode())
        self.server.set_client_final(token.decode())
        final = self.server.get_server_final()
        if self.forged_signature:
            final = "v=" + "A" * (len(final) - 2)
        return self._auth(data=final.encode())


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_a_right_password_logs_in_and_a_wrong_one_gets_kafkas_message(mechanism: str) -> None:
    users = {"alice": "pw-a", "a,b=c": "odd"}
    link = ServerLink(users, (mechanism,), lifetime_ms=7_000)
    assert asyncio.run(login(link, mechanism, "alice", "pw-a")) == 7_000
    assert asyncio.run(login(ServerLink(users, (mechanism,)), mechanism, "a,b=c", "odd")) == 0
    with pytest.raises(LoginRefusedError) as refused:
        asyncio.run(login(ServerLink(users, (mechanism,)), mechanism, "alice", "wrong"))
    assert str(refused.value) == MESSAGE
    assert refused.value.reason == "invalid_credentials"
    assert "wrong" not in str(refused.value)


def test_a_scram_server_signature_that_does_not_verify_is_refused() -> None:
    link = ServerLink({"alice": "pw"}, ("SCRAM-SHA-512",), forged_signature=True)
    with pytest.raises(LoginRefusedError, match="server signature") as refused:
        asyncio.run(login(link, "SCRAM-SHA-512", "alice", "pw"))
    assert refused.value.reason == "rejected"


def test_a_mechanism_kafka_does_not_enable_is_named() -> None:
    link = ServerLink({"alice": "pw"}, ("PLAIN",))
    with pytest.raises(LoginRefusedError, match="http_sasl_mechanism") as refused:
        asyncio.run(login(link, "SCRAM-SHA-512", "alice", "pw"))
    assert refused.value.reason == "unsupported_mechanism"
    assert "offers PLAIN" in str(refused.value)


def test_oauthbearer_sends_the_token_and_acknowledges_an_error_challenge() -> None:
    link = ServerLink({}, ("OAUTHBEARER",), tokens={"good": b"a.b.c"}, lifetime_ms=5)
    assert asyncio.run(login(link, "OAUTHBEARER", "", "a.b.c")) == 5
    assert link.rounds == [b"n,,\x01auth=Bearer a.b.c\x01\x01"]
    bad = ServerLink({}, ("OAUTHBEARER",), tokens={"good": b"a.b.c"})
    with pytest.raises(LoginRefusedError, match="status invalid_token") as refused:
        asyncio.run(login(bad, "OAUTHBEARER", "", "x.y.z"))
    assert bad.rounds[-1] == b"\x01"
    assert "x.y.z" not in str(refused.value)
