"""A replica's start-up steps, in the order ``replica.py`` takes them (each once, main thread).

1. :func:`ensure_topics`: with SASL, the replica's principal holds the ACLs it needs
   (:func:`check_acls`, kdelay/acls.py), or it refuses to run naming what is missing; no
   principal but kdelay's may WRITE the buffer topic (``release/buffer_writers.py``); the
   internal topics exist (and the shard's buffer topic, when it has
   one of its own), with the configured partitions, replication and ``min.insync.replicas``;
2. :func:`check_layout`: the delay set's shard layout in ZooKeeper is this replica's, or it
   refuses to run (two layouts would forward the same partitions twice);
3. :func:`serve_http`: the HTTP port (``health.py``) with the metrics, the probes and the
   message queries (``queries.py``);
4. :func:`start_forwarder`: the forwarder on the broker's clock (``broker_clock.py``), in the
   configured delivery mode (``exactly_once.make_forwarder``);
5. :func:`write_session_file`: the ZooKeeper session id and password for operators' fault
   drills (again after a new session replaced a lost one).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource  # not re-exported in the stubs

from kdelay import acl_check, logs
from kdelay.acls import REPLICA_GROUPS, Acl, replica_acls
from kdelay.broker_clock import BrokerClock
from kdelay.delay_service import away, health
from kdelay.delay_service.config import EXACTLY_ONCE, ReplicaConfig
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.metrics import Metrics
from kdelay.delay_service.queries.queries import Answers
from kdelay.delay_service.release.broker_clock import SkewHold
from kdelay.delay_service.release.buffer_writers import BufferWriters, check_at_start, combined
from kdelay.delay_service.release.exactly_once import make_forwarder
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.reshard import shard_dir
from kdelay.delay_service.store.store import Store
from kdelay.errors import ConfigError
from kdelay.topics import ensure_internal_topics
from kdelay.zk import Paths, Session
from kdelay.zk.layout import ensure_layout

log = logs.get(__name__)

SESSION_FILE = "zk-session.json"


def check_acls(cfg: ReplicaConfig) -> list[Acl] | None:
    """With SASL, raise kdelay.acl_check.MissingAclsError naming each ACL the replica's
    principal lacks (and the kafka-acls.sh command granting it); return the ACLs Kafka cannot
    be asked about, or None without SASL (nothing is checked)."""
    principal = cfg.kafka_principal()
    if principal is None:
        return None
    acls = replica_acls(cfg.buffer_topic, exactly_once=cfg.delivery == EXACTLY_ONCE)
    return acl_check.require(
        "replica",
        principal,
        acls,
        cfg.kafka_connection(cfg.bootstrap_servers),
        probes={REPLICA_GROUPS: f"{REPLICA_GROUPS}{cfg.name}"},
    )


def ensure_topics(cfg: ReplicaConfig) -> None:
    """Check the replica's ACLs (:func:`check_acls`) and that no principal but kdelay's may
    WRITE the buffer (``buffer_writers.check_at_start``), create the internal topics when
    missing (of buffer topics, only the one it reads: a shard's own or ``__kdelay_buffer``),
    and check again what could not be asked of the topics before they existed."""
    unchecked = check_acls(cfg)
    check_at_start(cfg)
    client = cfg.kafka_client_config()
    ensure_internal_topics(
        cfg.bootstrap_servers,
        partitions=cfg.buffer_partitions,
        replication=cfg.buffer_replication,
        min_insync=cfg.buffer_min_insync_replicas,
        client_config=client,
        buffer_topic=cfg.buffer_topic,  # a shard's own: no __kdelay_buffer beside it
    )
    if unchecked and acl_check.awaiting_topics(unchecked):
        check_acls(cfg)


def prepare_data_dir(cfg: ReplicaConfig) -> None:
    """Make ``cfg.data_dir`` ready for the store: a store of another shard or layout
    (``shard_dir.py``), or one away longer than the buffer topic keeps tombstones
    (``away.py``), is removed, to be rebuilt from the topic."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    shard_dir.prepare(cfg)
    away.rebuild_if_away(cfg.data_dir, cfg.data_dir / shard_dir.STORE_DIR, delete_retention_ms(cfg))


def delete_retention_ms(cfg: ReplicaConfig, timeout: float = 10.0) -> int:
    """The buffer topic's ``delete.retention.ms`` (how long the cleaner keeps tombstones), or
    Kafka's default, with a warning, when it cannot be read (delay_service/away.py)."""
    conf: dict[str, str | int | float | bool] = {**cfg.kafka_connection(cfg.bootstrap_servers)}
    admin = AdminClient(conf)
    resource = ConfigResource(ConfigResource.Type.TOPIC, cfg.buffer_topic)
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=timeout)
        return int(configs["delete.retention.ms"].value)
    except (KafkaException, KeyError, ValueError, TimeoutError) as exc:
        log.warning(
            "replica.delete_retention_unknown",
            topic=cfg.buffer_topic,
            error=str(exc),
            assumed_ms=away.DEFAULT_DELETE_RETENTION_MS,
        )
        return away.DEFAULT_DELETE_RETENTION_MS


def check_layout(cfg: ReplicaConfig, session: Session) -> None:
    """Refuse to run under another shard layout than ZooKeeper's (``zk/layout.py``): two
    layouts would forward the same partitions twice."""
    root = Paths(cfg.zk_root)
    layout = ensure_layout(session.client, root, cfg.shards)
    if layout.shards != cfg.shards:
        raise ConfigError(
            f"shards: this replica has --shards {cfg.shards}, but the delay set at "
            f"{root.layout} has {layout.shards}; start it with --shards {layout.shards}, "
            f"or stop every replica and change the layout with kdelay reshard"
        )
    log.info("replica.shard", shard=cfg.shard, shards=cfg.shards, root=cfg.set_paths.root)


def serve_http(
    cfg: ReplicaConfig, metrics: Metrics, checks: health.Health, store: Store
) -> tuple[Answers, str]:
    """Serve the HTTP port (health.py): metrics, probes, and the message queries from the
    store (queries.py), whose role, lag and broker clock the caller attaches once ingest and
    the forwarder exist. Returns the answers and the metrics URL, with the advertised host."""
    answers = Answers(store, cfg.name, max_scan=cfg.status_scan_limit)
    port = health.serve(
        cfg.metrics_host,
        cfg.metrics_port,
        health.app(metrics.registry, live=checks.live, ready=checks.ready, answers=answers),
    )
    url = f"http://{cfg.published_host}:{port}/metrics"
    log.info("replica.metrics_served", url=url)
    return answers, url


def start_forwarder(
    cfg: ReplicaConfig,
    store: Store,
    ingest: Ingest,
    metrics: Metrics,
    on_fenced: Callable[[str], None],
) -> tuple[Forwarder, BrokerClock]:
    """The forwarder, on the broker's clock: a due time is reached when *Kafka's* clock
    reaches it, not this machine's (broker_clock.py). The clock is started; the caller
    closes it."""
    clock = BrokerClock(cfg.bootstrap_servers, config=cfg.kafka_client_config(), metrics=metrics)
    clock.start()
    # A foreign writer of the buffer could have forged any record: nothing is released then.
    hold = combined(
        SkewHold(clock, cfg.max_clock_skew_ms, metrics), BufferWriters.for_replica(cfg, metrics)
    )
    forwarder = make_forwarder(
        cfg, store, ingest, metrics, on_fenced=on_fenced, clock=clock, hold=hold
    )
    return forwarder, clock


def write_session_file(cfg: ReplicaConfig, session: Session) -> None:
    """The ZooKeeper session id and password, for operators' fault drills (mode 0600)."""
    sid = session.session_id()
    if sid is None:
        return
    path = cfg.data_dir / SESSION_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({"session_id": sid[0], "password": sid[1].hex(), "pid": os.getpid()}, fh)
    Path(tmp).replace(path)
