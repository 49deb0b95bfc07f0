"""Producing with SASL_SSL through the proxy vs straight to Kafka, in the same run (not a test).

    .venv/bin/python -m bench.sasl_produce [--records N] [--rate R] [--rate-seconds S]
        [--rounds K] [--logins L]

Starts a local Kafka whose client listener is SASL_SSL with SCRAM-SHA-512 and KRaft's
StandardAuthorizer (dev/stack/kafka_security.py), a user ``bench`` allowed to WRITE one topic,
and two ``kdelay proxy`` subprocesses whose upstream is the secured listener as their own super
user: ``proxy`` with a SASL_SSL Kafka listener (each client's login relayed to Kafka, Kafka's ACLs
asked per principal and topic, cached ``acl_cache_ms``) and ``proxy-tls`` with a TLS listener and
no SASL (what the proxy costs without authentication, to tell SASL's share). The same idempotent
confluent-kafka producer, configured for SCRAM-SHA-512 over TLS (TLS only for ``proxy-tls``),
runs against Kafka directly and through each proxy, back to back, the order rotating, in each of
``--rounds`` rounds after one unreported warm-up round (the broker's JIT):

- throughput: ``--records`` records of 100 B and of 1 KB as fast as it can (immediate, and
  delayed through the proxy);
- latency at a fixed rate: ``--rate`` msg/s for ``--rate-seconds``, ack p50/p99;
- login: a new producer's first acknowledged record (TLS, the SCRAM exchange, metadata,
  producer id), median of ``--logins``.

Prints a Markdown table and the medians over rounds of the throughput ratio and the p99 and
login time the proxy adds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from bench.harness.timed_produce import timed_produce
from dev.kafka_tools import create_topic, unique_topic
from dev.stack import KDELAY, KafkaSecurity, KafkaSettings, LocalKafka, free_port
from dev.stack.process import wait_until

MECHANISM = "SCRAM-SHA-512"


@dataclass
class Cell:
    round: int
    path: str
    case: str
    msgs_per_s: float
    p50_ms: float
    p99_ms: float


def first_ack(bootstrap: str, conf: dict[str, str], topic: str) -> KafkaError | None:
    """A new producer's first record: None once acknowledged, else its error."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **conf})
    outcome: list[KafkaError | None] = []
    producer.produce(topic, b"login", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(60)
    if not outcome:
        return KafkaError(KafkaError._MSG_TIMED_OUT, "no acknowledgement within 60 s")
    return outcome[0]


def login_ms(bootstrap: str, conf: dict[str, str], topic: str) -> float:
    """A new producer's time to its first acknowledged record, ms."""
    began = time.perf_counter()
    error = first_ack(bootstrap, conf, topic)
    if error is not None:
        raise RuntimeError(f"the first record failed: {error}")
    return (time.perf_counter() - began) * 1000


@contextmanager
def secured_kafka(base: Path) -> Iterator[tuple[LocalKafka, KafkaSecurity]]:
    users = {u: secrets.token_urlsafe(18) for u in ("admin", "kdelay", "bench")}
    security = KafkaSecurity(
        users=users,
        protocol="SASL_SSL",
        mechanisms=(MECHANISM,),
        super_users=("admin", "kdelay"),
    )
    settings = KafkaSettings(quick_jit=False, security=security)  # the full JIT under load
    with LocalKafka(base / "kafka", settings=settings) as kafka:
        yield kafka, security


def grant_write(kafka: LocalKafka, user: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    binding = AclBinding(
        ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{user}", "*",
        AclOperation.WRITE, AclPermissionType.ALLOW,
    )  # fmt: skip
    for future in admin.create_acls([binding]).values():
        future.result(timeout=30)


@contextmanager
def proxy(kafka: LocalKafka, base: Path, listener: str) -> Iterator[str]:
    """``kdelay proxy`` with a ``listener`` (SASL_SSL or SSL) Kafka listener; secrets in its
    environment only."""
    assert kafka.ca is not None
    port, http = free_port(), free_port()
    env = {
        **os.environ,
        "KDELAY_PROXY_UPSTREAM_CONFIG": json.dumps(kafka.client_config("kdelay", MECHANISM)),
        "KDELAY_PROXY_SASL_MECHANISMS": json.dumps([MECHANISM]),
        # Not a deployment: the HTTP API is unused, and proxy-tls measures the proxy without
        # SASL on purpose (proxy/secure_defaults.py).
        "KDELAY_PROXY_HTTP_ALLOW_UNAUTHENTICATED": "true",
        "KDELAY_PROXY_LISTENER_ALLOW_UNAUTHENTICATED": "true",
    }
    argv = [
        KDELAY, "proxy", "--listen", f"127.0.0.1:{port}", "--http-listen", f"127.0.0.1:{http}",
        "--bootstrap-servers", kafka.secure_bootstrap_servers, "--log-level", "WARNING",
        "--listener-security-protocol", listener, "--tls-cert", str(kafka.ca.server_cert),
        "--tls-key", str(kafka.ca.server_key),
    ]  # fmt: skip
    with (base / f"proxy-{listener}.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if "ready" not in line:
                raise RuntimeError(f"proxy did not start: {line!r}; see {log.name}")
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=30_000)
    ap.add_argument("--rate", type=int, default=5_000, help="msg/s of the fixed-rate cell")
    ap.add_argument("--rate-seconds", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="direct/proxy pairs of each cell")
    ap.add_argument("--logins", type=int, default=5, help="new producers per path and round")
    args = ap.parse_args()
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="kdelay-bench-sasl-") as tmp:
        base = Path(tmp)
        with (
            secured_kafka(base) as (kafka, _security),
            proxy(kafka, base, "SASL_SSL") as via_sasl,
            proxy(kafka, base, "SSL") as via_tls,
        ):
            conf = kafka.client_config("bench", MECHANISM)
            tls_only = {"security.protocol": "SSL", "ssl.ca.location": conf["ssl.ca.location"]}
            topic = unique_topic("bench-sasl")
            create_topic(kafka.bootstrap_servers, topic, partitions=3)
            grant_write(kafka, "bench", topic)
            wait_until(
                lambda: first_ack(kafka.secure_bootstrap_servers, conf, topic) is None,
                timeout=60,
                what="the ACL to apply",
            )
            paths = [
                ("direct", kafka.secure_bootstrap_servers, conf),
                ("proxy", via_sasl, conf),
                ("proxy-tls", via_tls, tls_only),
            ]
            for k in range(args.rounds + 1):
                shift = k % len(paths)
                for path, bootstrap, client in paths[shift:] + paths[:shift]:
                    cells += run_round(args, k, path, bootstrap, conf=client, topic=topic)
    report([c for c in cells if c.round > 0])  # round 0 warms the broker up


def run_round(
    args: argparse.Namespace, k: int, path: str, bootstrap: str, *, conf: dict[str, str],
    topic: str,
) -> list[Cell]:  # fmt: skip
    """Every case of one round on one path."""
    cells = []
    for size in (100, 1024):
        r = timed_produce(bootstrap, topic, args.records, size, kind="immediate", conf=conf)
        cells.append(Cell(k, path, f"immediate {size} B", *r))
    if path != "direct":
        r = timed_produce(bootstrap, topic, args.records, 100, kind="delayed", conf=conf)
        cells.append(Cell(k, path, "delayed 100 B", *r))
    n = args.rate * args.rate_seconds
    r = timed_produce(bootstrap, topic, n, 100, kind="immediate", rate=args.rate, conf=conf)
    cells.append(Cell(k, path, f"immediate 100 B @{args.rate}/s", *r))
    logins = [login_ms(bootstrap, conf, topic) for _ in range(args.logins)]
    cells.append(Cell(k, path, "login to first ack", math.nan, statistics.median(logins),
                      max(logins)))  # fmt: skip
    return cells


def report(cells: list[Cell]) -> None:
    print("| round | path | case | msg/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for c in cells:
        rate = "" if math.isnan(c.msgs_per_s) else f"{c.msgs_per_s:,.0f}"
        print(f"| {c.round} | {c.path} | {c.case} | {rate} | {c.p50_ms:.1f} | {c.p99_ms:.1f} |")
    print()
    by = {(c.round, c.path, c.case): c for c in cells}
    rounds = sorted({c.round for c in cells})
    for base_path, path in (("direct", "proxy"), ("direct", "proxy-tls"), ("proxy-tls", "proxy")):
        for case in dict.fromkeys(c.case for c in cells if c.path == base_path):
            pairs = [
                (by[(k, base_path, case)], by[(k, path, case)])
                for k in rounds
                if (k, path, case) in by
            ]
            if not pairs:
                continue
            head = f"- {path} vs {base_path}, {case}:"
            if case.startswith("login"):
                added = statistics.median(p.p50_ms - d.p50_ms for d, p in pairs)
                print(f"{head} median login time added {added:+.1f} ms")
                continue
            ratio = statistics.median(p.msgs_per_s / d.msgs_per_s for d, p in pairs)
            p99 = statistics.median(p.p99_ms - d.p99_ms for d, p in pairs)
            p50 = statistics.median(p.p50_ms - d.p50_ms for d, p in pairs)
            print(
                f"{head} throughput ratio {ratio:.2f}, p99 added {p99:+.1f} ms, p50 added "
                f"{p50:+.1f} ms (median of {len(pairs)} rounds)"
            )


if __name__ == "__main__":
    main()
