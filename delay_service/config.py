"""The replica's configuration: one frozen object from flags, ``KDELAY_REPLICA_*`` or a file."""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from kdelay.buffer import BUFFER_TOPIC
from kdelay.config import component_config
from zk.paths import DEFAULT_ROOT, Paths


class ReplicaConfig(BaseSettings):
    """Settings of one delay-service replica; validated once, at start-up."""

    model_config = component_config("KDELAY_REPLICA_")

    name: str = Field(default_factory=socket.gethostname, min_length=1, max_length=200)
    bootstrap_servers: str = Field(default="127.0.0.1:9092", min_length=1)
    zk_connect: str = Field(default="127.0.0.1:2181", min_length=1)
    zk_root: str = DEFAULT_ROOT
    zk_session_timeout: float = Field(default=10.0, gt=0, le=600, description="seconds")
    data_dir: Path = Path(".kdelay/replica")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=0, ge=0, le=65535, description="0: pick a free port")
    buffer_topic: str = Field(default=BUFFER_TOPIC, min_length=1, description="a shard's own")
    buffer_partitions: int = Field(default=12, ge=1, description="when creating the topic")
    buffer_replication: int = Field(default=1, ge=1, description="when creating the topic")
    checkpoint_interval_ms: int = Field(default=100, ge=1, le=60_000)
    dead_letter_after: int = Field(default=5, ge=1, description="attempts before dead-letter")
    retry_backoff_ms: int = Field(default=100, ge=1)
    retry_backoff_max_ms: int = Field(default=5_000, ge=1)
    produce_timeout_ms: int = Field(default=30_000, ge=1_000)
    scan_batch: int = Field(default=10_000, ge=1)
    metadata_interval_ms: int = Field(default=5_000, ge=100)
    status_interval_ms: int = Field(default=1_000, ge=50)
    log_level: str = "INFO"

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
