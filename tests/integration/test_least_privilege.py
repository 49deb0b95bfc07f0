"""Every kdelay component on a SASL_SSL Kafka as its own SCRAM user holding exactly the ACLs of
kdelay/acls.py, and each start refused, naming what is missing, without one of them.

The Kafka is tests/support/secure_kafka.py's (StandardAuthorizer, SASL_SSL listener). Its
PLAINTEXT listener stays open for the test's own helpers only (creating users, ACLs and topics,
reading results back): every kdelay process under test gets the secured listener and its own
user. Target topics are granted by name where the table says ``*`` (each target topic).

Passwords go to the components by environment variable or file only; the test then looks for
each password in their logs, /metrics pages, ``kdelay status`` and the command lines of the
processes and their children.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from dev.kafka_tools import consume_until, create_topic
from dev.stack import KDELAY, free_port, wait_until
from kdelay import acls, buffer
from kdelay import headers as h
from kdelay.acl_check import MissingAclsError
from kdelay.acls import TARGETS, Acl
from kdelay.delay_service import startup
from kdelay.delay_service.config import ReplicaConfig
from kdelay.verifier import cli as verifier_cli
from kdelay.verifier.config import VerifierConfig
from tests.support.infra import ZooKeeperInfra
from tests.support.replicas import ReplicaSet
from tests.support.secure_kafka import SecureKafka, secured_kafka

TIMEOUT_S = 90
#: When the message the test cancels is due, after the first send starts.
DOOMED_AFTER_MS = 30_000


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with secured_kafka(tmp_path_factory.mktemp("lp"), "SASL_SSL") as sk:
        yield sk


def _grant(secure: SecureKafka, user: str, wanted: list[Acl], targets: list[str]) -> None:
    """ALLOW ``wanted`` to ``user``, the ``*`` target topics as each of ``targets``."""
    bindings = []
    for acl in wanted:
        names = targets if acl.resource == "TOPIC" and acl.name == TARGETS else [acl.name]
        bindings += [
            AclBinding(
                ResourceType[acl.resource if acl.resource != "CLUSTER" else "BROKER"],
                name,
                ResourcePatternType[acl.pattern],
                f"User:{user}",
                "*",
                AclOperation[acl.operation],
                AclPermissionType.ALLOW,
            )
            for name in names
        ]
    admin = AdminClient({"bootstrap.servers": secure.plain})
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)


def _buffer_writers_only(secure: SecureKafka, *users: User) -> list[str]:
    """Delete WRITE on the buffer of every principal but ``users`` (earlier tests' proxies and
    replicas: a replica refuses to start while another may write it, buffer_writers.py); the
    replica flag naming ``users`` as the buffer's writers."""
    keep = {f"User:{u.name}" for u in users}
    admin = AdminClient({"bootstrap.servers": secure.plain})
    match = AclBindingFilter(
        ResourceType.TOPIC, buffer.BUFFER_TOPIC, ResourcePatternType.LITERAL,
        cast("str", None), cast("str", None), AclOperation.WRITE, AclPermissionType.ALLOW,
    )  # fmt: skip
    bindings = admin.describe_acls(match).result(timeout=30)
    others = [b for b in bindings if b.principal not in keep]
    if others:
        filters = [
            AclBindingFilter(
                b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                b.permission_type,
            )
            for b in others
        ]  # fmt: skip
        for future in admin.delete_acls(filters).values():
            future.result(timeout=30)
    return ["--buffer-writers", ",".join(sorted(keep))]


def _verifier_topic(secure: SecureKafka) -> None:
    """``__kdelay_verifier``, as an administrator creates it (the verifier does not)."""
    _topics(secure, [acls.VERIFIER_TOPIC])


def _topics(secure: SecureKafka, names: list[str]) -> None:
    """Each of ``names`` that does not exist yet, created by the administrator."""
    admin = AdminClient({"bootstrap.servers": secure.plain})
    existing = admin.list_topics(timeout=30).topics
    for name in names:
        if name not in existing:
            create_topic(secure.plain, name, 1)


def _without(table: list[Acl], name: str, operation: str) -> list[Acl]:
    kept = [a for a in table if not (a.name == name and a.operation == operation)]
    assert len(kept) == len(table) - 1
    return kept


@dataclass
class User:
    name: str
    password: str
    secret_file: Path


def _user(secure: SecureKafka, tmp: Path, prefix: str) -> User:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    password = secure.add_user(name)
    secret = tmp / f"{name}.password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    return User(name, password, secret)


def _flags(secure: SecureKafka, user: User) -> list[str]:
    assert secure.ca is not None
    return [
        "--kafka-security-protocol", "SASL_SSL",
        "--kafka-sasl-mechanism", "SCRAM-SHA-512",
        "--kafka-sasl-username", user.name,
        "--kafka-ssl-ca-file", str(secure.ca),
    ]  # fmt: skip


def _run(
    *args: str, env: dict[str, str], timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KDELAY, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **env},
    )


def _ready(proc: subprocess.Popen[str], log: Path) -> str:
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if sel.select(timeout=0.5):
            line = proc.stdout.readline()
            if "kdelay proxy ready" in line:
                return line
        if proc.poll() is not None:
            break
    raise AssertionError(f"kdelay proxy not ready (exit {proc.poll()}): {log.read_text()}")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _cmdline(pid: int) -> str:
    return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        return str(resp.read().decode())


def test_proxy_and_replica_on_least_privilege_deliver_and_cancel_and_show_no_password(
    secure: SecureKafka, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    proxy_user = _user(secure, tmp_path, "lp-proxy")
    replica_user = _user(secure, tmp_path, "lp-replica")
    client = _user(secure, tmp_path, "lp-client")
    passwords = [proxy_user.password, replica_user.password, client.password]
    target = f"lp-target-{uuid.uuid4().hex[:6]}"
    create_topic(secure.plain, target, 1)
    _grant(secure, proxy_user.name, acls.proxy_acls(), [target])
    _grant(secure, replica_user.name, acls.replica_acls(), [target])
    _grant(secure, client.name, acls.client_acls(), [target])
    writers = _buffer_writers_only(secure, proxy_user, replica_user)
    assert secure.local.ca is not None

    kafka_port, http_port = free_port(), free_port()
    proxy_log = tmp_path / "proxy.log"
    proxy_argv = [
        KDELAY, "proxy", "--workers", "2",
        "--listen", f"127.0.0.1:{kafka_port}", "--http-listen", f"127.0.0.1:{http_port}",
        "--bootstrap-servers", secure.secure, "--buffer-partitions", "3",
        "--listener-security-protocol", "SASL_SSL",
        "--tls-cert", str(secure.local.ca.server_cert),
        "--tls-key", str(secure.local.ca.server_key),
        "--http-allow-unauthenticated",  # this test drives the HTTP API without logins
        *_flags(secure, proxy_user),
    ]  # fmt: skip
    proxy_env = {**os.environ, "KDELAY_PROXY_KAFKA_SASL_PASSWORD": proxy_user.password}
    with (
        proxy_log.open("w") as err,
        subprocess.Popen(
            proxy_argv, stdout=subprocess.PIPE, stderr=err, text=True, env=proxy_env
        ) as proxy,
        ReplicaSet(
            tmp_path, secure.secure, zookeeper.connect, count=1, partitions=3,
            buffer_topic=buffer.BUFFER_TOPIC, extra_args=[*_flags(secure, replica_user), *writers],
            wrap={"replica-1": ([], {"KDELAY_REPLICA_KAFKA_SASL_PASSWORD": replica_user.password})},
        ) as rs,
    ):  # fmt: skip
        try:
            _ready(proxy, proxy_log)
            rs.start_all()
            rs.wait_master(timeout=TIMEOUT_S)
            client_env = {"KDELAY_KAFKA_SASL_PASSWORD": client.password}
            address = f"127.0.0.1:{kafka_port}"
            # Due times from now, with room for three commands to start on a busy machine.
            start_ms = int(time.time() * 1000)
            doomed = _run(
                "send", "--bootstrap-servers", address, "--topic", target,
                "--at", str(start_ms + DOOMED_AFTER_MS),
                *_flags(secure, client), "cancelled", env=client_env,
            )  # fmt: skip
            assert doomed.returncode == 0, doomed.stderr
            doomed_id = json.loads(doomed.stdout)["id"]
            kept = _run(
                "send", "--bootstrap-servers", address, "--topic", target,
                "--at", str(start_ms + DOOMED_AFTER_MS + 3_000),
                *_flags(secure, client), "kept", env=client_env,
            )  # fmt: skip
            assert kept.returncode == 0, kept.stderr
            kept_id = json.loads(kept.stdout)["id"]
            cancel = _run(  # the password from a file this time
                "cancel", "--bootstrap-servers", address, "--topic", target,
                *_flags(secure, client), "--kafka-sasl-password-file", str(client.secret_file),
                doomed_id, env={},
            )  # fmt: skip
            assert cancel.returncode == 0, cancel.stderr
            assert json.loads(cancel.stdout) == {"id": doomed_id, "cancel": "accepted"}
            cancelled_ms = int(time.time() * 1000)
            assert cancelled_ms < start_ms + DOOMED_AFTER_MS, "the cancel came after the due time"

            records = consume_until(
                secure.plain,
                [target],
                lambda got: any(r.header(h.ID) == kept_id.encode() for r in got),
                timeout=TIMEOUT_S,
                config={"isolation.level": "read_committed"},
            )
            # The cancelled one was due 3 s before the kept one: released by now if it could be.
            assert [(r.value, r.header(h.ID)) for r in records] == [(b"kept", kept_id.encode())]

            # No password anywhere a user or an operator looks.
            seen = [doomed.stdout + doomed.stderr, kept.stdout + kept.stderr]
            seen.append(cancel.stdout + cancel.stderr)
            seen.append(_get(f"http://127.0.0.1:{http_port}/metrics"))
            status = _run(
                "status", "--zk-connect", zookeeper.connect, "--zk-root", rs.root, "--json",
                env={},
            )  # fmt: skip
            assert status.returncode == 0, status.stderr
            seen.append(status.stdout + status.stderr)
            replicas = json.loads(status.stdout)["replicas"]
            seen += [_get(str(r["metrics"])) for r in replicas]
            replica_proc = rs.replicas["replica-1"].proc
            assert replica_proc is not None
            pids = [proxy.pid, *_children(proxy.pid), *replica_pids(rs)]
            assert len(pids) >= 4  # the proxy, its 2 workers, the replica
            seen += [_cmdline(pid) for pid in pids]
        finally:
            proxy.send_signal(signal.SIGTERM)
            proxy.wait(TIMEOUT_S)
    seen.append(proxy_log.read_text())
    seen.append(rs.replicas["replica-1"].log_path.read_text())
    for component_log in seen[-2:]:  # the proxy's and the replica's: checked, none missing
        assert "kafka_acls.checked" in component_log
        assert "kafka_acls.optional_missing" not in component_log
    for text in seen:
        for password in passwords:
            assert password not in text


def replica_pids(rs: ReplicaSet) -> list[int]:
    """The replicas' process ids (the managed process, and any child it has)."""
    out = []
    for replica in rs.replicas.values():
        if replica.proc is not None and replica.proc.pid is not None:
            out += [replica.proc.pid, *_children(replica.proc.pid)]
    return out


def test_a_replica_without_read_on_the_buffer_refuses_to_start_naming_it(
    secure: SecureKafka, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    user = _user(secure, tmp_path, "lp-noread")
    _grant(secure, user.name, _without(acls.replica_acls(), buffer.BUFFER_TOPIC, "READ"), [])
    with ReplicaSet(
        tmp_path, secure.secure, zookeeper.connect, count=1, buffer_topic=buffer.BUFFER_TOPIC
    ) as rs:
        argv = rs.argv("replica-1")[1:]
    done = _run(
        *argv, *_flags(secure, user), env={"KDELAY_REPLICA_KAFKA_SASL_PASSWORD": user.password}
    )
    assert done.returncode == 2, done.stderr
    assert f"Kafka principal User:{user.name} lacks 1 ACL(s)" in done.stderr
    assert "READ on TOPIC __kdelay_buffer (ingest reads the buffer" in done.stderr
    assert (
        f"--add --allow-principal User:{user.name} --operation Read --topic __kdelay_buffer"
        in done.stderr
    )
    assert user.password not in done.stderr + done.stdout


def test_a_master_without_its_transactional_id_names_it(
    secure: SecureKafka, zookeeper: ZooKeeperInfra, tmp_path: Path
) -> None:
    """The one ACL Kafka cannot be asked about at start (InitProducerId would fence the running
    master): the new master's init_transactions names it, not a fencing."""
    user = _user(secure, tmp_path, "lp-notxn")
    table = _without(acls.replica_acls(), acls.RELEASE_TRANSACTIONAL_IDS, "WRITE")
    _grant(secure, user.name, table, [])
    _buffer_writers_only(secure, user)
    with ReplicaSet(
        tmp_path, secure.secure, zookeeper.connect, count=1, partitions=3,
        buffer_topic=buffer.BUFFER_TOPIC, extra_args=_flags(secure, user),
        wrap={"replica-1": ([], {"KDELAY_REPLICA_KAFKA_SASL_PASSWORD": user.password})},
    ) as rs:  # fmt: skip
        rs.start_all()
        log = rs.replicas["replica-1"].log_path
        wanted = f"Kafka denies User:{user.name} WRITE on TRANSACTIONAL_ID kdelay-release:*"
        wait_until(lambda: wanted in log.read_text(), timeout=TIMEOUT_S, what="the denied id named")
        text = log.read_text()
    assert "--operation Write --transactional-id kdelay-release: --resource-pattern-type" in text
    assert "FencedError" not in text  # librdkafka's error is fatal: it was taken for one
    assert user.password not in text


def test_a_proxy_without_write_on_the_buffer_refuses_to_start_naming_it(
    secure: SecureKafka, tmp_path: Path
) -> None:
    user = _user(secure, tmp_path, "lp-nowrite")
    _grant(secure, user.name, _without(acls.proxy_acls(), buffer.BUFFER_TOPIC, "WRITE"), [])
    done = _run(
        "proxy", "--listen", f"127.0.0.1:{free_port()}",
        "--http-listen", f"127.0.0.1:{free_port()}", "--bootstrap-servers", secure.secure,
        "--listener-allow-unauthenticated", *_flags(secure, user),
        env={"KDELAY_PROXY_KAFKA_SASL_PASSWORD": user.password},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    text = done.stderr
    assert f"proxy: Kafka principal User:{user.name} lacks 1 ACL(s)" in text
    assert "WRITE on TOPIC __kdelay_buffer (writes delayed records and cancels)" in text
    assert f"--allow-principal User:{user.name} --operation Write --topic __kdelay_buffer" in text
    assert user.password not in text + done.stdout


def test_each_component_missing_any_checkable_acl_is_refused(
    secure: SecureKafka, tmp_path: Path
) -> None:
    """For every ACL the start-up check can ask, a principal holding all the others is refused
    with exactly that one named (the replica's and the verifier's tables; topics exist)."""
    assert secure.ca is not None
    security = {
        "bootstrap_servers": secure.secure,
        "kafka_security_protocol": "SASL_SSL",
        "kafka_ssl_ca_file": secure.ca,
    }
    # Every topic the tables name exists, so each READ and WRITE is checkable, also when this
    # test runs without the first one, whose proxy and replica create the internal topics.
    tables = acls.replica_acls() + acls.verifier_acls()
    named = {a.name for a in tables if a.resource == "TOPIC" and a.pattern == "LITERAL"}
    _topics(secure, sorted(named - {TARGETS}))
    cases: list[tuple[str, list[Acl], Acl]] = []
    for table, component in ((acls.replica_acls(), "replica"), (acls.verifier_acls(), "verifier")):
        for acl in table:
            checkable = acl.required and acl.operation != "CREATE"
            askable = acl.resource in ("TOPIC", "GROUP", "CLUSTER")
            if checkable and askable and acl.name != TARGETS:
                cases.append((component, table, acl))
    assert len(cases) >= 8
    for component, table, acl in cases:
        user = _user(secure, tmp_path, f"lp-{component[:3]}")
        _grant(secure, user.name, [a for a in table if a != acl], [])
        login = {**security, "kafka_sasl_username": user.name, "kafka_sasl_password": user.password}
        with pytest.raises(MissingAclsError) as err:
            _check(component, login)
        assert err.value.missing == [acl], (component, acl)
        assert acl.describe() in str(err.value)


def _check(component: str, login: dict[str, Any]) -> None:
    if component == "replica":
        startup.check_acls(ReplicaConfig(name="lp", **login))
    else:
        verifier_cli.check_acls(VerifierConfig(**login))


def test_the_verifier_once_on_sasl_ssl_reports_right(secure: SecureKafka, tmp_path: Path) -> None:
    """``kdelay verify --once`` as its own user with the verifier's ACLs: 3 messages delivered
    on time, 1 missing, 1 cancelled; its output holds no password."""
    user = _user(secure, tmp_path, "lp-verifier")
    vbuf, target = f"lp-vbuf-{uuid.uuid4().hex[:6]}", f"lp-vtgt-{uuid.uuid4().hex[:6]}"
    create_topic(secure.plain, vbuf, 1)
    create_topic(secure.plain, target, 1, config={"message.timestamp.type": "LogAppendTime"})
    _verifier_topic(secure)
    _grant(secure, user.name, acls.verifier_acls(vbuf), [target])
    now = int(time.time() * 1000)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": secure.plain, "enable.idempotence": True})
    scheduled = [
        buffer.Scheduled(f"v{i}", target, -1, None, b"v", now - 20_000 + i * 1000) for i in range(5)
    ]
    for s in scheduled:
        enc = buffer.encode(s)
        producer.produce(vbuf, enc.value, enc.key, headers=list(enc.headers), partition=0)
    cancel = buffer.encode(buffer.Cancel("v4"))
    producer.produce(vbuf, cancel.value, cancel.key, headers=list(cancel.headers), partition=0)
    for s in scheduled[:3]:  # v3 missing, v4 cancelled
        producer.produce(target, s.value, s.key, headers=list(s.delivered_headers()))
    assert producer.flush(30) == 0
    report = tmp_path / "report.json"
    done = _run(
        "verify", "--once", "--report", str(report), "--bootstrap-servers", secure.secure,
        "--buffer-topic", vbuf, "--topics", target, "--grace-ms", "1000",
        "--end-ms", str(now + 10_000), *_flags(secure, user),
        env={"KDELAY_VERIFIER_KAFKA_SASL_PASSWORD": user.password}, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(report.read_text())
    assert {k: got[k] for k in ("scheduled", "delivered", "missing", "duplicates")} == {
        "scheduled": 4,
        "delivered": 3,
        "missing": 1,
        "duplicates": 0,
    }, got
    assert user.password not in done.stdout + done.stderr
    assert "kafka_acls.checked" in done.stderr
    # The window results reached __kdelay_verifier under the verifier's WRITE.
    consume_until(secure.plain, [acls.VERIFIER_TOPIC], lambda r: len(r) >= 1, timeout=60)
