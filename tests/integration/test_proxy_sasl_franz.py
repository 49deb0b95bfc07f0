"""franz-go through the SASL proxy: the third client family.

tests/support/franz/main.go, a small franz-go (github.com/twmb/franz-go, pinned in its go.mod
and go.sum) producer and consumer, is built once with ``go build`` into ``.cache/go-bin`` (keyed
by its sources and the Go version; modules come from the Go module proxy) and run against the
SASL_SSL proxy in front of the secured Kafka of tests/support/secure_kafka.py, exactly as it
would be run against Kafka: only ``-brokers`` changes. Each mechanism produces immediate
records, read back at once from Kafka's own secured listener with the same credentials, and a
delayed one that a replica releases after its delay; a wrong password and a principal without
WRITE get Kafka's errors, and franz-go shows the same text through the proxy as directly, but
for one case: a principal that may write no topic at all is refused by Kafka at InitProducerId
(CLUSTER_AUTHORIZATION_FAILED) and by the proxy at Produce (TOPIC_AUTHORIZATION_FAILED).

Without a Go toolchain the tests fail, saying so: they never skip silently.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kdelay import buffer
from kdelay import headers as h
from kdelay.proxy import running_proxy
from kdelay.proxy.app import Proxy
from tests.support.infra import ZooKeeperInfra
from tests.support.kafka_helpers import create_topic, unique_topic
from tests.support.replicas import ReplicaSet
from tests.support.secure_kafka import PLAIN_REAUTH_MS, SecureKafka, secured_kafka

ROOT = Path(__file__).parents[2]
FRANZ_SRC = ROOT / "tests" / "support" / "franz"
BIN_DIR = ROOT / ".cache" / "go-bin"
#: Where Go's own installer puts the toolchain, when ``go`` is not on PATH.
GO_DEFAULT = Path("/usr/local/go/bin/go")
PASSWORD_ENV = "FRANZ_SASL_PASSWORD"  # noqa: S105 - the variable's name, not a password
NOT_THE_PASSWORD = "not-the-password"  # noqa: S105 - a wrong password, on purpose
DELAY_MS = 1_500
WRONG = (
    "Authentication failed during authentication due to invalid credentials with SASL "
    "mechanism SCRAM-SHA-512"
)
TOPIC_DENIED = (
    "TOPIC_AUTHORIZATION_FAILED: Not authorized to access topics: [Topic authorization failed.]"
)


def _go() -> str:
    """The Go toolchain: $GO, else ``go`` on PATH, else Go's default /usr/local/go/bin/go."""
    candidates = [os.environ.get("GO"), shutil.which("go"), str(GO_DEFAULT)]
    for go in candidates:
        if go and os.access(go, os.X_OK):
            return go
    pytest.fail(
        "the franz-go client (tests/support/franz) needs the Go toolchain (1.26+) to build, and "
        f"none was found: not $GO, not `go` on PATH, not {GO_DEFAULT}. Install Go or set "
        "GO=/path/to/go.",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def franz() -> Path:
    """tests/support/franz built, once per version of its sources and of Go."""
    go = _go()
    env = {**os.environ, "GOFLAGS": "-buildvcs=false -modcacherw", "GOTOOLCHAIN": "local"}
    version = subprocess.run(
        [go, "version"], capture_output=True, text=True, check=True, env=env
    ).stdout
    digest = hashlib.sha256(version.encode())
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((FRANZ_SRC / name).read_bytes())
    binary = BIN_DIR / f"franz-{digest.hexdigest()[:16]}"
    if binary.exists():
        return binary
    BIN_DIR.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"{binary.name}.{os.getpid()}.tmp")
    built = subprocess.run(
        [go, "build", "-trimpath", "-o", str(partial), "."],
        cwd=FRANZ_SRC, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    if built.returncode != 0:
        pytest.fail(
            f"go build of tests/support/franz failed ({go}, {version.strip()}):\n"
            f"{built.stderr[-3000:]}",
            pytrace=False,
        )
    partial.replace(binary)  # atomic: a concurrent build of the same key writes the same file
    for stale in BIN_DIR.glob("franz-*"):  # builds of older sources
        if stale != binary and not stale.name.endswith(".tmp"):
            stale.unlink(missing_ok=True)
    return binary


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("sasl-franz"), "SASL_SSL") as sk:
        yield sk


@pytest.fixture(scope="module")
def proxy(secure: SecureKafka) -> Iterator[Proxy]:
    with running_proxy(secure.proxy_config()) as px:
        yield px


@pytest.fixture(scope="module")
def replicas(
    secure: SecureKafka, zookeeper: ZooKeeperInfra, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ReplicaSet]:
    """One replica releasing what the proxy buffers (it reads Kafka's open listener)."""
    with ReplicaSet(
        tmp_path_factory.mktemp("franz-replicas"), secure.plain, zookeeper.connect, count=1,
        partitions=3, buffer_topic=buffer.BUFFER_TOPIC,
    ) as rs:  # fmt: skip
        rs.start_all()
        rs.wait_master(timeout=90)
        yield rs


@dataclass
class Run:
    """One run of the franz client: its JSON line."""

    out: dict[str, Any]

    @property
    def error(self) -> str | None:
        err = self.out.get("error")
        return str(err) if err is not None else None

    @property
    def code(self) -> str | None:
        code = self.out.get("code")
        return str(code) if code else None


def _franz(
    binary: Path, secure: SecureKafka, brokers: str, user: str, mechanism: str, *, topic: str,
    password: str | None = None, count: int = 1, delayed: int = 0, consume: bool = False,
    timeout_s: int = 60, extra: tuple[str, ...] = (),
) -> Run:  # fmt: skip
    """Run the franz client as ``user``; the password goes through the environment only."""
    assert secure.ca is not None
    args = [
        str(binary), "-brokers", brokers, "-mechanism", mechanism, "-user", user,
        "-password-env", PASSWORD_ENV, "-ca-file", str(secure.ca), "-topic", topic,
        "-partition", "1", "-count", str(count), "-delayed", str(delayed),
        "-delay-header", f"{h.DELAY_MS}={DELAY_MS}", "-timeout", f"{timeout_s}s",
    ]  # fmt: skip
    if consume:
        args += ["-consume-brokers", secure.secure]
    args += extra
    env = {**os.environ, PASSWORD_ENV: secure.password(user) if password is None else password}
    result = subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=timeout_s + 60, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines, f"no output; stderr: {result.stderr[-3000:]}"
    run = Run(json.loads(lines[-1]))
    print(f"\nfranz {user}/{mechanism} -> {brokers}: {lines[-1]}")
    return run


def _addr(px: Proxy) -> str:
    assert px.addresses is not None
    return px.addresses.kafka


def _metric(px: Proxy, name: str, labels: dict[str, str]) -> float:
    return px.metrics.registry.get_sample_value(name, labels) or 0.0


def _topic(secure: SecureKafka, prefix: str, user: str, *operations: str) -> str:
    topic = unique_topic(prefix)
    create_topic(secure.plain, topic, partitions=2)
    secure.grant(user, topic, *operations)
    return topic


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER"])
def test_franz_go_produces_immediate_and_delayed_with_each_mechanism(
    franz: Path, secure: SecureKafka, proxy: Proxy, replicas: ReplicaSet, mechanism: str
) -> None:
    """Three immediate records at offsets 0-2 and one delayed record (offset -1, delivered by
    the replica no earlier than its delay after it was sent), read back from Kafka's secured
    listener by franz-go with the same credentials."""
    topic = _topic(secure, "franz-ok", "alice", "WRITE", "READ")
    run = _franz(franz, secure, _addr(proxy), "alice", mechanism, topic=topic, count=3,
                 delayed=1, consume=True)  # fmt: skip
    assert run.error is None, run.out
    now = [p for p in run.out["produced"] if not p["delayed"]]
    later = [p for p in run.out["produced"] if p["delayed"]]
    assert [(p["partition"], p["offset"]) for p in now] == [(1, 0), (1, 1), (1, 2)]
    assert [(p["partition"], p["offset"]) for p in later] == [(1, -1)]
    read = {c["value"]: c for c in run.out["consumed"]}
    assert {p["value"]: p["offset"] for p in now} == {
        v: read[v]["offset"] for v in (p["value"] for p in now)
    }
    delivered = read[later[0]["value"]]
    assert delivered["offset"] == 3
    assert delivered["headers"].get(h.ID) == later[0]["id"]
    assert h.DELAY_MS not in delivered["headers"]
    # Due no earlier than its delay after it was sent, and read no earlier than due.
    due = int(delivered["headers"][h.DELIVER_AT])
    assert due >= later[0]["sent_ms"] + DELAY_MS
    assert delivered["received_ms"] >= due
    sent = later[0]["sent_ms"]
    print(
        f"{mechanism}: immediate read {read[now[0]['value']]['received_ms'] - now[0]['sent_ms']} "
        f"ms after sent; delayed ({DELAY_MS} ms) due {due - sent} ms and read "
        f"{delivered['received_ms'] - sent} ms after sent"
    )


def test_reauthentication_keeps_a_franz_go_producer_going(
    franz: Path, secure: SecureKafka, proxy: Proxy
) -> None:
    """PLAIN sessions last PLAIN_REAUTH_MS on this Kafka (KIP-368): producing one record at a
    time for three lifetimes, franz-go logs in again on its connections before they expire
    (at least twice in all), the proxy relays that, and no record fails."""
    topic = _topic(secure, "franz-reauth", "alice")
    reauths = {"mechanism": "PLAIN", "kind": "reauthentication"}
    expired = {"mechanism": "PLAIN", "reason": "session_expired"}
    before = _metric(proxy, "kdelay_proxy_authentications_total", reauths)
    expired_before = _metric(proxy, "kdelay_proxy_auth_failures_total", expired)
    run = _franz(franz, secure, _addr(proxy), "alice", "PLAIN", topic=topic,
                 extra=("-repeat-for", f"{3 * PLAIN_REAUTH_MS}ms"))  # fmt: skip
    assert run.error is None, run.out
    after = _metric(proxy, "kdelay_proxy_authentications_total", reauths)
    print(f"{run.out['repeated']} records, {after - before:.0f} re-authentications")
    assert run.out["repeated"] > 0
    assert after >= before + 2
    assert _metric(proxy, "kdelay_proxy_auth_failures_total", expired) == expired_before


def test_without_a_go_toolchain_the_tests_fail_saying_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not a silent skip: a CI machine without Go fails these tests, naming what is missing."""
    monkeypatch.delenv("GO", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "GO_DEFAULT", tmp_path / "go")
    with pytest.raises(pytest.fail.Exception, match=r"needs the Go toolchain \(1\.26\+\)"):
        _go()


def test_a_wrong_password_gets_sasl_authentication_failed_as_directly(
    franz: Path, secure: SecureKafka, proxy: Proxy
) -> None:
    """What a franz-go application sees, the same through the proxy as from Kafka: the failed
    login in its OnBrokerConnect hook and its ERROR log at once, Ping's error at once, and the
    record failed with it as the last error once RecordDeliveryTimeout passes (franz-go keeps
    retrying the metadata until then: without that option, until the caller's deadline)."""
    topic = _topic(secure, "franz-wrong", "alice")
    kafka_error = f"SASL_AUTHENTICATION_FAILED: SASL Authentication failed.: {WRONG}"
    seen: dict[str, list[str]] = {}
    for name, addr in (("proxy", _addr(proxy)), ("kafka", secure.secure)):
        produced = _franz(
            franz, secure, addr, "alice", "SCRAM-SHA-512", topic=topic, password=NOT_THE_PASSWORD,
            extra=("-delivery-timeout", "5s"),
        )  # fmt: skip
        pinged = _franz(
            franz, secure, addr, "alice", "SCRAM-SHA-512", topic=topic, password=NOT_THE_PASSWORD,
            extra=("-ping",),
        )  # fmt: skip
        assert produced.out["stage"] == "produce"
        assert produced.code == "SASL_AUTHENTICATION_FAILED"
        assert produced.out["connect_error_code"] == "SASL_AUTHENTICATION_FAILED"
        assert pinged.out["stage"] == "ping"
        assert pinged.code == "SASL_AUTHENTICATION_FAILED"
        seen[name] = [
            produced.error or "",
            produced.out["connect_error"],
            produced.out["logged_error"],
            pinged.error or "",
        ]
    assert seen["proxy"] == seen["kafka"]
    assert seen["proxy"] == [
        f"records have timed out before they were able to be produced, last err: {kafka_error}",
        kafka_error,
        f"unable to initialize sasl broker seed_0 err {kafka_error}",
        kafka_error,
    ]


@pytest.mark.parametrize("kind", ["immediate", "delayed"])
def test_a_principal_without_write_gets_topic_authorization_failed(
    franz: Path, secure: SecureKafka, proxy: Proxy, kind: str
) -> None:
    """carol may write another topic, and only describe this one: her record fails with Kafka's
    TOPIC_AUTHORIZATION_FAILED, delayed or not, in the very text franz-go shows when Kafka
    itself refuses the same record."""
    _topic(secure, "franz-carols", "carol")  # WRITE there: IDEMPOTENT_WRITE on the cluster
    topic = _topic(secure, f"franz-denied-{kind}", "carol", "DESCRIBE")
    runs = {name: _denied(franz, secure, addr, "carol", topic=topic, kind=kind) for name, addr in
            (("proxy", _addr(proxy)), ("kafka", secure.secure))}  # fmt: skip
    assert runs["proxy"] == runs["kafka"] == ("TOPIC_AUTHORIZATION_FAILED", TOPIC_DENIED)


@pytest.mark.parametrize("kind", ["immediate", "delayed"])
def test_a_principal_without_any_write_is_refused_at_produce_not_at_init_producer_id(
    franz: Path, secure: SecureKafka, proxy: Proxy, kind: str
) -> None:
    """bob may write no topic at all. Kafka then refuses franz-go's InitProducerId (idempotence
    is on by default; IDEMPOTENT_WRITE comes with WRITE on any topic), so every record fails
    with CLUSTER_AUTHORIZATION_FAILED; the proxy allocates producer ids itself
    (proxy/kafka/idempotence.py) and refuses the record with TOPIC_AUTHORIZATION_FAILED. Refused
    either way; the code differs."""
    topic = _topic(secure, f"franz-nowrite-{kind}", "bob", "DESCRIBE")
    assert _denied(franz, secure, _addr(proxy), "bob", topic=topic, kind=kind) == (
        "TOPIC_AUTHORIZATION_FAILED",
        TOPIC_DENIED,
    )
    assert _denied(franz, secure, secure.secure, "bob", topic=topic, kind=kind) == (
        "CLUSTER_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED: Cluster authorization failed.",
    )


def _denied(
    franz: Path, secure: SecureKafka, brokers: str, user: str, *, topic: str, kind: str
) -> tuple[str | None, str | None]:
    """The code and text of the one record's failure (immediate or delayed)."""
    count, delayed = (1, 0) if kind == "immediate" else (0, 1)
    run = _franz(franz, secure, brokers, user, "SCRAM-SHA-512", topic=topic, count=count,
                 delayed=delayed)  # fmt: skip
    assert run.out["stage"] == "produce", run.out
    assert len(run.out["produced"]) == 1, run.out
    record = run.out["produced"][0]
    assert (record["delayed"], record["code"], record["error"]) == (
        kind == "delayed",
        run.code,
        run.error,
    )
    return run.code, run.error
