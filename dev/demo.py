"""``make demo``: the whole stack, ~5,000 delayed messages, the Spark verifier's verdict.

1. ``kdelay up`` in a subprocess (its progress is shown as it happens);
2. two target topics x 4 partitions, ``message.timestamp.type=LogAppendTime`` (the verifier
   judges "early" and lateness by the broker's clock); 5,000 messages through the proxy with
   an ordinary confluent-kafka producer, delays 0-10 s, spread over ``kdelay-delay-ms``,
   ``kdelay-deliver-at`` (epoch ms and RFC 3339) and ``kdelay-delay-level`` (1-3);
3. wait until every message has come out (or a deadline passes);
4. ``kdelay verify --once`` with the demo's SLO, print the report and the chart's path;
5. stop everything. Exit status: the verifier's (0 when the SLO holds).

``python -m dev.demo --secure`` (``make demo-secure``) runs the same demo on ``kdelay up
--secure``, as a user of a secured cluster would: with the state file's super user it creates a
Kafka user ``demo`` allowed to WRITE the demo topics only, and sends as ``demo`` through the
proxy's SASL_SSL listener (SCRAM-SHA-512, the local CA).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
from confluent_kafka.admin._scram import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from confluent_kafka.cimpl import NewTopic

from dev.stack.process import ManagedProcess, python_argv, wait_until
from kdelay import headers as h

MESSAGES = 5000
TOPICS = ("demo-orders", "demo-payments")
PARTITIONS = 4
MAX_DELAY_MS = 10_000
SLO = {"--max-p99-ms": "1000", "--max-early": "0", "--max-missing": "0", "--max-duplicates": "0"}
WORK = Path(".kdelay/demo")
#: The broker stamps every delivered record: the verifier's clock (report "clock").
TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}


def say(line: str) -> None:
    print(line, flush=True)  # noqa: T201 - the demo talks to a person


def start_stack(*, secure: bool = False) -> tuple[ManagedProcess, dict[str, object]]:
    state_file = WORK / "up.json"
    flags = ["--secure"] if secure else []
    up = ManagedProcess(
        "kdelay-up",
        python_argv(
            "up", "--data-dir", str(WORK / "data"), "--state-file", str(state_file), *flags
        ),
        WORK / "up.log",
    )
    up.start()
    shown = 0

    def ready() -> bool:
        nonlocal shown
        lines = up.log_path.read_text(errors="replace").splitlines() if up.log_path.exists() else []
        for line in lines[shown:]:
            if line.startswith(("==>", "    ", "kdelay")):
                say(f"  {line}")
        shown = len(lines)
        return state_file.exists() and any(line == "kdelay ready" for line in lines)

    wait_until(ready, timeout=600, what="kdelay up to print 'kdelay ready'", interval=0.3, proc=up)
    return up, json.loads(state_file.read_text())


#: The Kafka user the secured demo sends as.
DEMO_USER = "demo"


def sasl_config(state: dict[str, object], user: str, password: str) -> dict[str, str]:
    """librdkafka settings for ``user`` on the state file's secured listeners (none if open)."""
    sec = state.get("security")
    if not isinstance(sec, dict):
        return {}
    return {
        "security.protocol": str(sec["protocol"]),
        "sasl.mechanism": str(sec["mechanism"]),
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(sec["ca_file"]),
    }


def admin_config(state: dict[str, object]) -> dict[str, str]:
    """The state file's Kafka super user (``kdelay up --secure``), or nothing."""
    sec = state.get("security")
    if not isinstance(sec, dict):
        return {}
    admin = sec["admin"]
    return sasl_config(state, str(admin["username"]), str(admin["password"]))


def create_demo_user(kafka: str, admin: dict[str, str]) -> str:
    """A SCRAM user allowed to WRITE (and DESCRIBE) the demo topics only; its password."""
    password = secrets.token_urlsafe(18)
    client = AdminClient({"bootstrap.servers": kafka, **admin})
    upsert = UserScramCredentialUpsertion(
        DEMO_USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
    )
    for future in client.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    acls = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            f"User:{DEMO_USER}",
            "*",
            op,
            AclPermissionType.ALLOW,
        )
        for topic in TOPICS
        for op in (AclOperation.WRITE, AclOperation.DESCRIBE)
    ]
    for future in client.create_acls(acls).values():
        future.result(timeout=30)
    say(f"  Kafka user {DEMO_USER!r} may WRITE {', '.join(TOPICS)}, nothing else")
    return password


def create_topics(kafka: str, admin: dict[str, str] | None = None) -> None:
    admin_client = AdminClient({"bootstrap.servers": kafka, **(admin or {})})
    topics = [NewTopic(t, PARTITIONS, 1, config=dict(TOPIC_CONFIG)) for t in TOPICS]
    for future in admin_client.create_topics(topics).values():
        future.result(timeout=30)


def timing_header(i: int, now_ms: int, rng: random.Random) -> tuple[str, bytes]:
    kind = i % 4
    if kind == 0:
        return h.DELAY_MS, str(rng.randint(0, MAX_DELAY_MS)).encode()
    if kind == 1:
        return h.DELIVER_AT, str(now_ms + rng.randint(0, MAX_DELAY_MS)).encode()
    if kind == 2:
        due = datetime.fromtimestamp((now_ms + rng.randint(0, MAX_DELAY_MS)) / 1000, tz=UTC)
        return h.DELIVER_AT, due.isoformat(timespec="milliseconds").encode()
    return h.DELAY_LEVEL, str(rng.randint(1, 3)).encode()  # 1 s, 5 s, 10 s


def send(proxy: str, security: dict[str, str] | None = None) -> float:
    producer = Producer(
        {
            "bootstrap.servers": proxy,
            "enable.idempotence": True,
            "linger.ms": 5,
            "compression.type": "lz4",
            **(security or {}),
        }
    )
    # A long-lived producer has its producer id already: librdkafka's idempotent producer holds
    # its first records ~0.5 s while it acquires one (direct to Kafka just as through the
    # proxy; confluentinc/librdkafka#5032), which would count as lateness for the burst's
    # absolute due times. One ordinary record, acknowledged, first.
    producer.produce(TOPICS[0], value=b"warm-up", headers=[("source", b"kdelay-demo")])
    if producer.flush(60):
        raise SystemExit("demo: the proxy did not acknowledge the warm-up record in 60 s")
    rng = random.Random(7)
    failures: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err)

    started = time.time()
    for i in range(MESSAGES):
        now_ms = int(time.time() * 1000)
        producer.produce(
            TOPICS[i % len(TOPICS)],
            value=json.dumps({"order": i, "sent_ms": now_ms}).encode(),
            key=f"order-{i}".encode(),
            headers=[timing_header(i, now_ms, rng), ("source", b"kdelay-demo")],
            on_delivery=on_delivery,
        )
        producer.poll(0)
        if (i + 1) % 1000 == 0:
            say(f"  sent {i + 1}/{MESSAGES}")
    left = producer.flush(120)
    if left or failures:
        raise SystemExit(f"demo: {left} unacknowledged, {len(failures)} failed: {failures[:3]}")
    say(f"  all {MESSAGES} acknowledged by the proxy in {time.time() - started:.1f} s")
    return started


def _header(msg: Message, name: str) -> bytes | None:
    raw = msg.headers() or []
    for key, value in raw.items() if isinstance(raw, dict) else raw:
        if key == name:
            return value.encode() if isinstance(value, str) else value
    return None


def wait_delivered(kafka: str, deadline_s: float, admin: dict[str, str] | None = None) -> int:
    consumer = Consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": "kdelay-demo-watch",
            "enable.auto.commit": False,
            **(admin or {}),
        }
    )
    consumer.assign([TopicPartition(t, p, -2) for t in TOPICS for p in range(PARTITIONS)])
    seen: set[bytes] = set()
    last = time.monotonic()
    try:
        while len(seen) < MESSAGES and time.time() < deadline_s:
            for msg in consumer.consume(1000, timeout=0.5):
                if msg.error() is None:
                    msg_id = _header(msg, h.ID)
                    if msg_id is not None:
                        seen.add(msg_id)
            if time.monotonic() - last > 2:
                last = time.monotonic()
                say(f"  delivered {len(seen)}/{MESSAGES}")
    finally:
        consumer.close()
    say(f"  delivered {len(seen)}/{MESSAGES}")
    return len(seen)


def verify(kafka: str, state: dict[str, object]) -> int:
    report = WORK / "report.json"
    env = None
    security: list[str] = []
    sec = state.get("security")
    if isinstance(sec, dict):
        # As the super user; its password by environment, never on the command line.
        env = {**os.environ, "KDELAY_VERIFIER_KAFKA_SASL_PASSWORD": str(sec["admin"]["password"])}
        security = [
            "--kafka-security-protocol", str(sec["protocol"]),
            "--kafka-sasl-mechanism", str(sec["mechanism"]),
            "--kafka-sasl-username", str(sec["admin"]["username"]),
            "--kafka-ssl-ca-file", str(sec["ca_file"]),
        ]  # fmt: skip
    argv = python_argv(
        "verify",
        "--once",
        "--bootstrap-servers",
        kafka,
        "--topics",
        ",".join(TOPICS),
        "--output-dir",
        str(WORK / "verifier"),
        "--report",
        str(report),
        *[x for pair in SLO.items() for x in pair],
        *security,
    )
    say("==> kdelay verify --once (Spark Structured Streaming)")
    code = subprocess.run(argv, check=False, env=env).returncode
    if report.exists():
        say(json.dumps(json.loads(report.read_text()), indent=2))
        say(f"report: {report}")
    for chart in sorted(WORK.glob("report.*.png")):
        say(f"chart:  {chart}")
    return code


def main() -> None:
    secure = "--secure" in sys.argv[1:]
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    began = time.monotonic()
    say("==> kdelay up" + (" --secure" if secure else ""))
    up, state = start_stack(secure=secure)
    code = 1
    try:
        kafka, proxy = str(state["kafka"]), str(state["proxy"])
        admin = admin_config(state)
        create_topics(kafka, admin)
        producer_security: dict[str, str] = {}
        if secure:
            producer_security = sasl_config(state, DEMO_USER, create_demo_user(kafka, admin))
        say(f"==> sending {MESSAGES} delayed messages through the proxy at {proxy}")
        started = send(proxy, producer_security)
        say("==> waiting for them to fall due and be delivered")
        wait_delivered(kafka, started + MAX_DELAY_MS / 1000 + 60, admin)
        code = verify(kafka, state)
    finally:
        say("==> stopping the stack")
        up.signal(signal.SIGTERM)
        wait_until(lambda: not up.alive(), timeout=120, what="kdelay up to stop")
        up.stop()
    verdict = "SLO met" if code == 0 else "SLO MISSED"
    slo = ", ".join(f"{k} {v}" for k, v in SLO.items())
    say(f"demo finished in {time.monotonic() - began:.0f} s: {verdict} ({slo})")
    sys.exit(code)


if __name__ == "__main__":
    main()
