"""The proxy's one frozen configuration object (flags, ``KDELAY_PROXY_*`` variables, a file)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings

from kdelay.config import component_config
from kdelay.headers import DEFAULT_LEVELS_MS, DEFAULT_MAX_HORIZON_MS, DelayPolicy


def _host_port(value: str, setting: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{setting} must be host:port, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class ProxyConfig(BaseSettings):
    """Settings of one proxy process; see ``kdelay proxy --help``."""

    model_config = component_config("KDELAY_PROXY_")

    listen: str = "127.0.0.1:9192"
    advertised_host: str | None = None
    advertised_port: int | None = Field(default=None, ge=1, le=65535)
    http_listen: str = "127.0.0.1:8180"
    bootstrap_servers: str = "127.0.0.1:9092"
    buffer_partitions: int = Field(default=12, ge=1)
    buffer_replication: int = Field(default=1, ge=1)
    ensure_topics: bool = True
    node_id: int = Field(default=1, ge=0)
    max_request_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    #: Largest size a compressed record batch may decompress to (default: max_request_bytes).
    max_decompressed_bytes: int | None = Field(default=None, ge=1024)
    max_inflight_per_connection: int = Field(default=5, ge=1)
    idle_timeout_s: float = Field(default=600.0, gt=0)
    upstream_timeout_ms: int = Field(default=30_000, ge=1_000)
    upstream_linger_ms: float = Field(default=1.0, ge=0)
    upstream_config: dict[str, str] = Field(default_factory=dict)
    metadata_ttl_s: float = Field(default=5.0, ge=0)
    delay_levels_ms: tuple[int, ...] = DEFAULT_LEVELS_MS
    max_horizon_ms: int = Field(default=DEFAULT_MAX_HORIZON_MS, ge=1)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    log_level: str = "INFO"

    @field_validator("listen", "http_listen")
    @classmethod
    def _valid_address(cls, value: str, info: ValidationInfo) -> str:
        _host_port(value, str(info.field_name))
        return value

    @field_validator("delay_levels_ms")
    @classmethod
    def _valid_levels(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(v < 0 for v in value):
            raise ValueError("delay levels must be a non-empty list of milliseconds >= 0")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> ProxyConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        return self

    @property
    def listen_address(self) -> tuple[str, int]:
        """Host and port of the Kafka listener."""
        return _host_port(self.listen, "listen")

    @property
    def http_address(self) -> tuple[str, int]:
        """Host and port of the HTTP API."""
        return _host_port(self.http_listen, "http_listen")

    @property
    def decompressed_limit(self) -> int:
        """The bound on a batch's decompressed size."""
        return self.max_decompressed_bytes or self.max_request_bytes

    @property
    def policy(self) -> DelayPolicy:
        """How delay headers are interpreted."""
        return DelayPolicy(levels_ms=self.delay_levels_ms, max_horizon_ms=self.max_horizon_ms)
