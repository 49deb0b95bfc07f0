"""kcat (Debian's, librdkafka 2.0) through the SASL proxy: every client family logs in.

librdkafka before 2.1 turns on its SASL handshake only when the broker's ApiVersions range for
SaslHandshake includes v0 (its feature map asks for v0..v0), as Kafka 4.3's does (v0-v1). The
proxy advertised v1 only, so kcat found "no SASL handshake support" and was refused every
mechanism through the proxy ("SASL Handshake not supported by broker (required by mechanism
...)") while it logged in to Kafka directly. Now the proxy advertises what Kafka does, and kcat
lists metadata and produces through the proxy with PLAIN; with SCRAM it gets Kafka's own answer
(see the SCRAM test for why Kafka 4 refuses this librdkafka's SCRAM).

The secured Kafka is tests/support/secure_kafka.py's (SASL_PLAINTEXT here: kcat's TLS settings
add nothing to the handshake). kcat reads its credentials from a file (``-F``), never argv.
Without kcat (``make install`` puts it in /usr/bin) the tests skip, saying so.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import scramp
from kafka.protocol.metadata import ApiVersionsRequest

from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from kdelay.proxy.wire import protocol as p
from tests.support.kafka_helpers import consume_until, create_topic, unique_topic
from tests.support.raw_client import (
    RawClient,
    metadata_request,
    plain_token,
    sasl_handshake_request,
)
from tests.support.secure_kafka import SecureKafka, secured_kafka

pytestmark = pytest.mark.integration

KCAT = shutil.which("kcat")
SCRAM = ("SCRAM-SHA-512", "SCRAM-SHA-256")


@pytest.fixture(scope="module")
def kcat() -> str:
    if KCAT is None:
        pytest.skip("kcat is not installed (make install, or apt-get install kcat)")
    return KCAT


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("sasl-kcat"), "SASL_PLAINTEXT") as sk:
        yield sk


@pytest.fixture(scope="module")
def proxy(secure: SecureKafka) -> Iterator[Proxy]:
    with running_proxy(secure.proxy_config()) as px:
        yield px


def _proxy_address(px: Proxy) -> str:
    assert px.addresses is not None
    return px.addresses.kafka


def _config_file(tmp_path: Path, mechanism: str, password: str) -> Path:
    path = tmp_path / f"kcat-{mechanism}.conf"
    path.touch(mode=0o600)
    path.write_text(
        "security.protocol=SASL_PLAINTEXT\n"
        f"sasl.mechanisms={mechanism}\n"
        "sasl.username=alice\n"
        f"sasl.password={password}\n"
    )
    return path


def _kcat(kcat: str, config: Path, bootstrap: str, *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        [kcat, "-F", str(config), "-b", bootstrap, "-m", "30", *args],
        input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"kcat {' '.join(args)} failed:\n{done.stderr[-2000:]}"
    return done.stdout


def test_kcat_lists_metadata_through_the_proxy_with_plain(
    kcat: str, secure: SecureKafka, proxy: Proxy, tmp_path: Path
) -> None:
    config = _config_file(tmp_path, "PLAIN", secure.password("alice"))
    direct = _kcat(kcat, config, secure.secure, "-L")
    assert "1 brokers:" in direct  # the same client logs in to Kafka itself
    # Before the fix: "SASL Handshake not supported by broker (required by mechanism PLAIN)".
    through = _kcat(kcat, config, _proxy_address(proxy), "-L")
    assert "1 brokers:" in through
    assert f"at {_proxy_address(proxy)}" in through


def test_kcat_produces_through_the_proxy_with_plain(
    kcat: str, secure: SecureKafka, proxy: Proxy, tmp_path: Path
) -> None:
    topic = unique_topic("kcat")
    create_topic(secure.plain, topic, 1)
    secure.grant("alice", topic, "WRITE", "DESCRIBE")
    config = _config_file(tmp_path, "PLAIN", secure.password("alice"))
    _kcat(kcat, config, _proxy_address(proxy), "-P", "-t", topic, stdin="one\ntwo\n")
    records = consume_until(secure.plain, [topic], lambda rs: len(rs) >= 2, timeout=60)
    assert sorted(r.value or b"" for r in records) == [b"one", b"two"]


@pytest.mark.parametrize("mechanism", SCRAM)
def test_kcat_gets_kafkas_own_scram_answer_through_the_proxy(
    kcat: str, secure: SecureKafka, proxy: Proxy, tmp_path: Path, mechanism: str
) -> None:
    """librdkafka before 2.6.1 builds a SCRAM client-final message that Kafka 4 refuses (the
    client nonce appended twice; confluentinc/librdkafka#4895, edenhill/kcat#462): kcat 1.7.1
    on librdkafka 2.0.2 cannot log in to Kafka 4.3 with SCRAM even directly. Through the proxy
    it now reaches that same answer from Kafka (before the fix: the proxy's "SASL Handshake
    not supported")."""
    config = _config_file(tmp_path, mechanism, secure.password("alice"))
    direct = _kcat_failure(kcat, config, secure.secure)
    through = _kcat_failure(kcat, config, _proxy_address(proxy))
    kafkas = (
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )
    assert kafkas in direct
    assert kafkas in through, through


def test_a_wrong_password_is_refused_through_the_proxy(
    kcat: str, secure: SecureKafka, proxy: Proxy, tmp_path: Path
) -> None:
    config = _config_file(tmp_path, "PLAIN", "not-alices-password")
    assert "Authentication failed" in _kcat_failure(kcat, config, _proxy_address(proxy))


def test_the_proxy_advertises_kafkas_sasl_handshake_versions(
    secure: SecureKafka, proxy: Proxy
) -> None:
    def handshake_range(address: str) -> tuple[int, int]:
        with RawClient(address) as client:
            answer = client.request(ApiVersionsRequest(version=0))
        (api,) = [a for a in answer.api_keys if a.api_key == p.SASL_HANDSHAKE]
        return api.min_version, api.max_version

    kafka = handshake_range(secure.secure)
    assert kafka == (0, 1)  # Kafka 4.3
    assert handshake_range(_proxy_address(proxy)) == kafka  # before the fix: (1, 1)


def _kcat_failure(kcat: str, config: Path, bootstrap: str) -> str:
    done = subprocess.run(
        [kcat, "-F", str(config), "-b", bootstrap, "-m", "10", "-L"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    return done.stderr


# ---- SaslHandshake v0: bare SASL tokens, as Kafka still takes them -----------------------------


def _bare(token: bytes) -> bytes:
    return struct.pack(">i", len(token)) + token


def _v0_login(client: RawClient, mechanism: str, password: str) -> bool:
    """A SaslHandshake v0 and the exchange in bare size-prefixed tokens (no SaslAuthenticate
    framing, KIP-43's original form) as alice; False when the server closed the connection
    (Kafka's answer to a failed v0 login)."""
    handshake = client.request(sasl_handshake_request(mechanism, version=0))
    assert handshake.error_code == 0, handshake
    if mechanism == "PLAIN":
        client.send_bytes(_bare(plain_token("alice", password)))
        answer = client.read_frame()
        assert answer in (None, b"")  # PLAIN's empty server response, sent bare too
        return answer is not None
    scram = scramp.ScramClient([mechanism], "alice", password)
    client.send_bytes(_bare(scram.get_client_first().encode()))
    server_first = client.read_frame()
    assert server_first is not None
    scram.set_server_first(server_first.decode())
    client.send_bytes(_bare(scram.get_client_final().encode()))
    server_final = client.read_frame()
    if server_final is None:
        return False
    scram.set_server_final(server_final.decode())  # checks the server's signature
    return True


@pytest.mark.parametrize("mechanism", ["PLAIN", *SCRAM])
def test_a_v0_handshake_logs_in_with_bare_tokens_as_on_kafka(
    secure: SecureKafka, proxy: Proxy, mechanism: str
) -> None:
    """Before the fix the proxy closed the connection at the v0 handshake (unsupported)."""
    for address in (secure.secure, _proxy_address(proxy)):
        with RawClient(address) as client:
            assert _v0_login(client, mechanism, secure.password("alice")), address
            answer = client.request(metadata_request(None))
            assert len(answer.brokers) == 1, address


def test_a_v0_login_with_a_wrong_password_is_closed_unanswered_as_on_kafka(
    secure: SecureKafka, proxy: Proxy
) -> None:
    for address in (secure.secure, _proxy_address(proxy)):
        with RawClient(address) as client:
            assert not _v0_login(client, "PLAIN", "not-alices-password"), address
