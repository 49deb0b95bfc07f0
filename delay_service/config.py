"""The replica's configuration: one frozen object from flags, ``KDELAY_REPLICA_*`` or a file."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings

from kdelay.buffer import BUFFER_TOPIC
from kdelay.config_loader import TopicDurability, component_config
from kdelay.kafka_security import KafkaClientSecurity
from kdelay.zk.paths import DEFAULT_ROOT, Paths
from kdelay.zk.security import ZkSecurity

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
DELIVERY_MODES = (EXACTLY_ONCE, AT_LEAST_ONCE)


class ReplicaConfig(BaseSettings, TopicDurability, KafkaClientSecurity, ZkSecurity):
    """Settings of one delay-service replica; validated once, at start-up."""

    model_config = component_config("KDELAY_REPLICA_")

    name: str = Field(
        default_factory=socket.gethostname,
        min_length=1,
        max_length=200,
        description="replica name, unique in the replica set [the host name]",
    )
    bootstrap_servers: str = Field(
        default="127.0.0.1:9092", min_length=1, description="Kafka bootstrap servers"
    )
    zk_connect: str = Field(default="127.0.0.1:2181", min_length=1, description="ZooKeeper hosts")
    zk_root: str = Field(
        default=DEFAULT_ROOT,
        description="ZooKeeper root of the delay set (with --shards N > 1, shard i's replica "
        "set lives under <root>/shard-i)",
    )
    shards: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="shards dividing the buffer partitions: shard i owns partition p when "
        "p % shards == i (kdelay/shards.py); every replica of the set must agree, and only "
        "kdelay reshard changes it",
    )
    shard: int = Field(
        default=0, ge=0, description="the shard this replica belongs to, 0 .. shards-1"
    )
    zk_session_timeout: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="ZooKeeper session timeout, seconds: a killed master is replaced about "
        "this long after its last heartbeat (README, Failover time); the server clamps it to "
        "[2, 20] x its tickTime",
    )
    data_dir: Path = Field(
        default=Path(".kdelay/replica"), description="RocksDB and state directory"
    )
    metrics_host: str = Field(default="127.0.0.1", description="address the metrics server binds")
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="metrics port (0: pick a free one)"
    )
    advertised_host: str | None = Field(
        default=None,
        description="host published in ZooKeeper for the metrics port, where the proxy and "
        "kdelay status --id reach this replica [metrics_host; when that is a wildcard, "
        "$POD_IP, else the host name]",
    )
    status_scan_limit: int = Field(
        default=1_000_000,
        ge=1,
        description="most store entries one GET /v1/pending scans; past it the answer says "
        "truncated",
    )
    buffer_topic: str = Field(
        default=BUFFER_TOPIC, min_length=1, description="buffer topic of this replica set"
    )
    buffer_partitions: int = Field(
        default=12, ge=1, description="partitions when creating the buffer topic"
    )
    checkpoint_interval_ms: int = Field(
        default=100, ge=1, le=60_000, description="at most this long between checkpoints"
    )
    dead_letter_after: int = Field(
        default=5, ge=1, description="failed attempts before a permanent error dead-letters"
    )
    retry_backoff_ms: int = Field(default=100, ge=1, description="first retry backoff")
    retry_backoff_max_ms: int = Field(default=5_000, ge=1, description="maximum retry backoff")
    produce_timeout_ms: int = Field(
        default=30_000, ge=1_000, description="librdkafka message.timeout.ms of releases"
    )
    scan_batch: int = Field(default=10_000, ge=1, description="most entries released per round")
    metadata_interval_ms: int = Field(
        default=5_000, ge=100, description="how often new buffer partitions are sought"
    )
    status_interval_ms: int = Field(
        default=1_000, ge=50, description="how often the status node is refreshed"
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")
    # -- supervision and health (threads.py, health.py) -------------------------------------
    restart_backoff_ms: int = Field(
        default=1_000, ge=1, description="wait before running a failed thread again (doubling)"
    )
    restart_backoff_max_ms: int = Field(
        default=30_000, ge=1, description="longest wait before running a failed thread again"
    )
    max_component_failures: int = Field(
        default=5, ge=1, description="consecutive failures of a thread before the process exits"
    )
    ingest_stall_s: float = Field(
        default=60.0, gt=0, description="seconds without ingest progress before /readyz fails"
    )
    # -- the broker's clock (broker_clock.py) ----------------------------------------------
    max_clock_skew_ms: int = Field(
        default=10_000,
        ge=0,
        description="the master releases nothing while its wall clock is further than this "
        "from the broker's (releases follow the broker's clock either way; 0: no limit)",
    )
    skew_step_down_ms: int = Field(
        default=30_000,
        ge=0,
        description="a master holding its releases this long for clock skew (past "
        "--max-clock-skew-ms) steps down when another replica stands for election, and a "
        "replica stands while its clock is past the limit only when nobody else does, again "
        "once within it for 10 s (skew_step_down.py); when every replica is skewed one still "
        "holds the mastership. 30 s: a blip (a clock step being corrected, a few odd probes) "
        "costs no failover, and a master stuck on a bad clock is replaced well before alert "
        "KdelayReleaseHeld fires (2 min). 0: a skewed master holds and keeps the mastership",
    )
    # -- per-target isolation (forwarder.py, round.py, sender.py) ---------------------------
    round_ack_wait_ms: int = Field(
        default=20,
        ge=0,
        le=10_000,
        description="longest a round waits for its records' acknowledgements (the rest stay "
        "in flight and are settled by a later round)",
    )
    scan_skip_limit: int = Field(
        default=100_000,
        ge=1,
        description="most due entries of held targets one scan passes over before it stops; "
        "the next round's scan goes on from there (sweep.py), so a held target with N due "
        "entries delays the others by about N / this many rounds, each scanning at most this "
        "many",
    )
    # -- release smoothing (smoothing.py) --------------------------------------------------
    release_rate_limit: float | None = Field(
        default=None,
        gt=0,
        description="release rate limit, messages per second, of every target topic without "
        "its own in release_rate_limits: a burst due at once leaves at this rate, while other "
        "topics' messages go on at once [none]",
    )
    release_rate_limits: dict[str, float] = Field(
        default_factory=dict,
        description="release rate limit per target topic, messages per second (topic: rate; "
        "config file or KDELAY_REPLICA_RELEASE_RATE_LIMITS as JSON only), overriding "
        "--release-rate-limit for those topics",
    )
    # -- the release mode (forwarder.py, exactly_once.py) ----------------------------------
    delivery: str = Field(
        default=EXACTLY_ONCE,
        description="exactly-once: releases and their checkpoint commit in one Kafka "
        "transaction (read_committed consumers see no duplicate); at-least-once: an "
        "idempotent producer, duplicates possible around a failover",
    )
    transaction_timeout_ms: int = Field(
        default=60_000,
        ge=1_000,
        description="exactly-once: the broker aborts a transaction left open this long (a "
        "frozen master's)",
    )
    txn_ack_wait_ms: int = Field(
        default=2_000,
        ge=1,
        description="exactly-once: longest a round waits for its records' acknowledgements "
        "before it aborts and holds the targets that did not answer",
    )
    # -- revocation: the owner's WRITE before a release (release/owner_acls.py) ------------
    acl_cache_ms: int = Field(
        default=5_000,
        ge=0,
        description="how long Kafka's ACLs of a target topic are reused to decide whether a "
        "message's owner may still WRITE it before its release: a revoked owner's messages "
        "stop within this (0: asked every round)",
    )
    buffer_writers: str = Field(
        default="User:kdelay-proxy",
        description="the Kafka principals besides this replica's own login (and super_users) "
        "that may WRITE the buffer topic, comma-separated: the proxies'. Any other principal "
        "Kafka's ACLs let WRITE it stops the replica at start and holds the master's releases "
        "while running (release/buffer_writers.py) [User:kdelay-proxy, the proxy's user in "
        "the least-privilege table, the chart and kdelay up --secure]",
    )
    super_users: str = Field(
        default="",
        description="the brokers' super.users (User:admin;User:kdelay), which Kafka's admin "
        "API does not show: their messages are released without asking their ACLs [none]",
    )

    @property
    def published_host(self) -> str:
        """The host of the URL this replica publishes for its HTTP port (URL form: an IPv6
        address in brackets): ``advertised_host``, else ``metrics_host`` unless that is a
        wildcard, else ``$POD_IP`` (Kubernetes' downward API), else the host name."""
        host = self.advertised_host
        if not host:
            wildcard = self.metrics_host.strip("[]") in ("", "0.0.0.0", "::")
            host = (os.environ.get("POD_IP") or socket.gethostname()) if wildcard else None
        host = (host or self.metrics_host).strip("[]")
        return f"[{host}]" if ":" in host else host

    @field_validator("shard")
    @classmethod
    def _shard_in_range(cls, value: int, info: ValidationInfo) -> int:
        shards = info.data.get("shards")  # validated first (declared first)
        if isinstance(shards, int) and value >= shards:
            raise ValueError(f"must be in 0..{shards - 1} with {shards} shard(s), not {value}")
        return value

    @property
    def set_paths(self) -> Paths:
        """The znodes of this replica's replica set: its shard's (``zk/layout.py``)."""
        return Paths(self.zk_root).shard(self.shard, self.shards)

    @field_validator("delivery")
    @classmethod
    def _delivery(cls, value: str) -> str:
        if value not in DELIVERY_MODES:
            raise ValueError(f"must be one of {', '.join(DELIVERY_MODES)}")
        return value

    @field_validator("release_rate_limits")
    @classmethod
    def _rate_limits(cls, value: dict[str, float]) -> dict[str, float]:
        for topic, rate in value.items():
            if not topic:
                raise ValueError("a topic name must not be empty")
            if not rate > 0 or rate == float("inf"):
                raise ValueError(f"topic {topic!r}: the rate must be a positive number, not {rate}")
        return value

    @field_validator("zk_root")
    @classmethod
    def _root(cls, value: str) -> str:
        Paths(value)  # raises ValueError with the reason
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if "/" in value:
            raise ValueError("must not contain '/'")
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("must be DEBUG, INFO, WARNING or ERROR")
        return value.upper()
