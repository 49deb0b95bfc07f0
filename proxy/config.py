"""The proxy's one frozen configuration object (flags, ``KDELAY_PROXY_*`` variables, a file)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings

from kdelay.config_loader import TopicDurability, component_config
from kdelay.headers import DEFAULT_LEVELS_MS, DEFAULT_MAX_HORIZON_MS, DelayPolicy
from kdelay.kafka_security import KafkaClientSecurity, merge_client_config
from kdelay.proxy import limits as lim
from kdelay.proxy.login_config import LoginSettings
from kdelay.proxy.prelogin_config import PreloginSettings
from kdelay.proxy.secure_defaults import SecureDefaults
from kdelay.zk.paths import DEFAULT_ROOT, Paths
from kdelay.zk.security import ZkSecurity

#: What the Kafka listener may speak (Kafka's security.protocol names).
LISTENER_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: Who may call the HTTP API (``http_auth``) and how Basic credentials are checked.
HTTP_AUTH_MODES = ("none", "kafka")
HTTP_SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


def _host_port(value: str, setting: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{setting} must be host:port, got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class ProxyConfig(
    BaseSettings,
    TopicDurability,
    KafkaClientSecurity,
    ZkSecurity,
    SecureDefaults,
    PreloginSettings,
    LoginSettings,
):
    """Settings of one proxy process; see ``kdelay proxy --help``."""

    model_config = component_config("KDELAY_PROXY_")

    listen: str = Field(default="127.0.0.1:9192", description="Kafka listener host:port")
    advertised_host: str | None = Field(
        default=None, description="host clients are told to connect to (Kubernetes) [listen's]"
    )
    advertised_port: int | None = Field(
        default=None, ge=1, le=65535, description="port clients are told to connect to [listen's]"
    )
    http_listen: str = Field(default="127.0.0.1:8180", description="HTTP API host:port")
    bootstrap_servers: str = Field(
        default="127.0.0.1:9092", description="upstream Kafka bootstrap servers"
    )
    buffer_partitions: int = Field(
        default=12, ge=1, description="partitions of __kdelay_buffer when the proxy creates it"
    )
    ensure_topics: bool = Field(default=True, description="create the internal topics if missing")
    node_id: int = Field(default=1, ge=0, description="broker id the proxy advertises")
    max_request_bytes: int = Field(
        default=100 * 1024 * 1024,
        ge=1024,
        description="largest Kafka request or HTTP request body accepted",
    )
    max_buffered_request_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="request bytes held in memory at once, all connections and HTTP requests "
        "together; a request that does not fit waits, unread (README Limits)",
    )
    max_decompressed_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="largest size a compressed batch may expand to [max_request_bytes]",
    )
    max_inflight_per_connection: int = Field(
        default=5, ge=1, description="requests read ahead per connection before backpressure"
    )
    idle_timeout_s: float = Field(
        default=600.0, gt=0, description="close connections idle this long"
    )
    upstream_timeout_ms: int = Field(
        default=30_000, ge=1_000, description="upstream produce timeout (message.timeout.ms)"
    )
    upstream_probe_interval_s: float = Field(
        default=1.0,
        gt=0,
        description="while upstream is down, how often it is asked for metadata to see it back",
    )
    upstream_linger_ms: float = Field(default=1.0, ge=0, description="upstream linger.ms")
    upstream_config: dict[str, str] = Field(
        default_factory=dict, description="extra librdkafka settings for the upstream producer"
    )
    metadata_ttl_s: float = Field(default=5.0, ge=0, description="topic metadata cache lifetime")
    delay_levels_ms: tuple[int, ...] = Field(
        default=DEFAULT_LEVELS_MS, description="the kdelay-delay-level table, milliseconds"
    )
    max_horizon_ms: int = Field(
        default=DEFAULT_MAX_HORIZON_MS, ge=1, description="latest due time accepted, from now"
    )
    max_headers: int = Field(
        default=lim.DEFAULT_MAX_HEADERS,
        ge=8,
        description="most headers a record may carry, control headers included (README Limits)",
    )
    max_header_name_bytes: int = Field(
        default=lim.DEFAULT_MAX_HEADER_NAME_BYTES,
        ge=64,
        description="largest header name, UTF-8 bytes (README Limits)",
    )
    max_header_value_bytes: int = Field(
        default=lim.DEFAULT_MAX_HEADER_VALUE_BYTES,
        ge=1024,
        description="largest header value, bytes (README Limits)",
    )
    max_key_bytes: int = Field(
        default=lim.DEFAULT_MAX_KEY_BYTES, ge=1024, description="largest record key (README Limits)"
    )
    max_value_bytes: int = Field(
        default=lim.DEFAULT_MAX_VALUE_BYTES,
        ge=1024,
        description="largest record value; raise with upstream message.max.bytes (README Limits)",
    )
    producer_state_ttl_s: float = Field(
        default=86_400.0,
        ge=1,
        description="seconds an idle idempotent producer is remembered (producer.id.expiration.ms)",
    )
    max_producer_states: int = Field(
        default=10_000,
        ge=1,
        description="idempotent producers remembered at most; the least recently used is forgotten",
    )
    component_restart_backoff_s: float = Field(
        default=0.5, gt=0, description="first wait before restarting a failed component (doubles)"
    )
    component_max_failures: int = Field(
        default=10,
        ge=1,
        description="consecutive failures of one component after which the process exits (code 70)",
    )
    zk_connect: str | None = Field(
        default=None,
        description="ZooKeeper hosts of the delay-service replicas, for GET /v1/messages/{id} "
        "and GET /v1/pending (unset: those answer 503)",
    )
    zk_root: str = Field(
        default=DEFAULT_ROOT, description="ZooKeeper root of the replica set to ask"
    )
    replica_timeout_ms: int = Field(
        default=2_000,
        ge=100,
        le=60_000,
        description="longest GET /v1/messages/{id} waits for the replicas, all tried together",
    )
    pending_timeout_ms: int = Field(
        default=60_000,
        ge=100,
        le=600_000,
        description="longest GET /v1/pending waits for the replicas (a timeline scans the store)",
    )
    tls_cert: Path | None = Field(default=None, description="PEM certificate of the listener")
    tls_key: Path | None = Field(default=None, description="PEM key of the listener")
    listener_security_protocol: str | None = Field(
        default=None,
        description="what the Kafka listener speaks; SASL_* relays each client's login to "
        "upstream Kafka (upstream_config's security.protocol must then be SASL_*), SSL and "
        "SASL_SSL need tls_cert and tls_key [SSL with tls_cert, else PLAINTEXT]",
    )
    workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description="proxy processes sharing the Kafka and HTTP ports (SO_REUSEPORT), each "
        "using up to one core; more than 1 makes this process their supervisor (proxy/workers.py)",
    )
    reuse_port: bool = Field(
        default=False,
        description="set SO_REUSEPORT on both listeners, so several proxy processes share the "
        "ports (set for each worker by --workers)",
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")

    @field_validator("listen", "http_listen")
    @classmethod
    def _valid_address(cls, value: str, info: ValidationInfo) -> str:
        _host_port(value, str(info.field_name))
        return value

    @field_validator("zk_root")
    @classmethod
    def _root(cls, value: str) -> str:
        Paths(value)  # raises ValueError with the reason
        return value

    @field_validator("zk_connect")
    @classmethod
    def _zk_connect(cls, value: str | None) -> str | None:
        return (value.strip() or None) if value is not None else None

    @field_validator("delay_levels_ms")
    @classmethod
    def _valid_levels(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(v < 0 for v in value):
            raise ValueError("delay levels must be a non-empty list of milliseconds >= 0")
        return value

    @model_validator(mode="after")
    def _budget_fits_a_request(self) -> ProxyConfig:
        if self.max_buffered_request_bytes < self.max_request_bytes:
            raise ValueError(
                f"max_buffered_request_bytes ({self.max_buffered_request_bytes:,}) must be at "
                f"least max_request_bytes ({self.max_request_bytes:,}): a request that large "
                "could never be read"
            )
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> ProxyConfig:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key must be given together")
        return self

    @field_validator("listener_security_protocol")
    @classmethod
    def _protocol(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if value.upper() not in LISTENER_PROTOCOLS:
            raise ValueError(f"must be one of {', '.join(LISTENER_PROTOCOLS)}, got {value!r}")
        return value.upper()

    @model_validator(mode="after")
    def _listener_security(self) -> ProxyConfig:
        protocol = self.listener_protocol
        tls = protocol in ("SSL", "SASL_SSL")
        if tls != (self.tls_cert is not None):
            raise ValueError(
                f"listener_security_protocol {protocol} "
                + ("needs tls_cert and tls_key" if tls else "takes no tls_cert or tls_key")
            )
        # The merged settings: a contradiction between kafka_* and upstream_config is named here.
        upstream = self.upstream_client_config().get("security.protocol", "PLAINTEXT").upper()
        if self.sasl_enabled and not upstream.startswith("SASL_"):
            raise ValueError(
                f"listener_security_protocol {protocol} relays each client's SASL login to "
                "upstream Kafka, so the upstream security protocol (kafka_security_protocol, "
                f"or upstream_config's security.protocol) must be SASL_SSL or SASL_PLAINTEXT "
                f"(it is {upstream})"
            )
        return self

    def upstream_client_config(self) -> dict[str, str]:
        """librdkafka settings of every upstream client (producer, metadata, admin, broker
        clock, the SASL links' TLS): :meth:`kafka_client_config` with ``upstream_config`` on
        top. ``upstream_config`` adds what the ``kafka_*`` settings do not name; a setting both
        give must agree (``kafka_security_protocol``'s default PLAINTEXT gives way), else a
        ValueError names both (kdelay/kafka_security.py ``merge_client_config``)."""
        return merge_client_config(
            self.kafka_client_config(), dict(self.upstream_config), "upstream_config"
        )

    def upstream_principal(self) -> str | None:
        """The principal the proxy's upstream clients log in as (``User:<sasl.username>``), or
        None without SASL or with OAUTHBEARER (the token names it)."""
        conf = self.upstream_client_config()
        if not conf.get("security.protocol", "").upper().startswith("SASL_"):
            return None
        if conf.get("sasl.mechanism", "GSSAPI").upper() == "OAUTHBEARER":
            return None
        user = conf.get("sasl.username")
        return f"User:{user}" if user else None

    @property
    def listener_protocol(self) -> str:
        """What the Kafka listener speaks (``listener_security_protocol`` or its default)."""
        if self.listener_security_protocol is not None:
            return self.listener_security_protocol
        return "SSL" if self.tls_cert is not None else "PLAINTEXT"

    @property
    def sasl_enabled(self) -> bool:
        """Whether the Kafka listener authenticates clients with SASL."""
        return self.listener_protocol.startswith("SASL_")

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
    def limits(self) -> lim.RecordLimits:
        """The per-record limits both listeners enforce."""
        return lim.RecordLimits(
            max_headers=self.max_headers,
            max_header_name_bytes=self.max_header_name_bytes,
            max_header_value_bytes=self.max_header_value_bytes,
            max_key_bytes=self.max_key_bytes,
            max_value_bytes=self.max_value_bytes,
        )

    @property
    def policy(self) -> DelayPolicy:
        """How delay headers are interpreted."""
        return DelayPolicy(levels_ms=self.delay_levels_ms, max_horizon_ms=self.max_horizon_ms)

    # -- the HTTP API's HTTPS and authentication (proxy/http/auth.py) -----------------------

    http_tls_cert: Path | None = Field(
        default=None, description="PEM certificate of the HTTP API: HTTPS with http_tls_key"
    )
    http_tls_key: Path | None = Field(default=None, description="PEM key of the HTTP API")
    http_auth: str = Field(
        default="none",
        description="who may call the HTTP API: none (anyone) or kafka (HTTP Basic, and Bearer "
        "JWTs with http_jwks_file, checked by logging in to upstream Kafka as that principal; "
        "/healthz, /readyz and /metrics stay open)",
    )
    http_sasl_mechanism: str = Field(
        default="SCRAM-SHA-512",
        description="SASL mechanism Basic credentials are checked with at upstream Kafka: "
        "SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN",
    )
    http_jwks_file: Path | None = Field(
        default=None,
        description="JWKS file (JSON) whose keys sign the Bearer JWTs the HTTP API accepts "
        "(http_auth=kafka; upstream Kafka must accept them for OAUTHBEARER too)",
    )
    http_jwt_audience: str | None = Field(
        default=None, description="the aud claim a Bearer JWT must carry [not checked]"
    )
    http_allow_plaintext_auth: bool = Field(
        default=False,
        description="accept passwords and tokens over plain HTTP (http_auth=kafka without "
        "http_tls_cert; a trusted network only)",
    )

    @field_validator("http_auth")
    @classmethod
    def _http_auth(cls, value: str) -> str:
        if value.lower() not in HTTP_AUTH_MODES:
            raise ValueError(f"must be one of {', '.join(HTTP_AUTH_MODES)}, got {value!r}")
        return value.lower()

    @field_validator("http_sasl_mechanism")
    @classmethod
    def _http_mechanism(cls, value: str) -> str:
        if value.upper() not in HTTP_SASL_MECHANISMS:
            raise ValueError(f"must be one of {', '.join(HTTP_SASL_MECHANISMS)}, got {value!r}")
        return value.upper()

    @model_validator(mode="after")
    def _http_security(self) -> ProxyConfig:
        if (self.http_tls_cert is None) != (self.http_tls_key is None):
            raise ValueError("http_tls_cert and http_tls_key must be given together")
        for name in ("http_tls_cert", "http_tls_key", "http_jwks_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file {str(path)!r}")
        if self.http_auth == "none":
            if self.http_jwks_file is not None:
                raise ValueError("http_jwks_file is used only with http_auth=kafka")
            return self
        if not self.https and not self.http_allow_plaintext_auth:
            raise ValueError(
                "http_auth=kafka sends passwords and tokens with every request: set "
                "http_tls_cert and http_tls_key (HTTPS), or http_allow_plaintext_auth=true to "
                "accept them over plain HTTP on a trusted network"
            )
        upstream = self.upstream_client_config().get("security.protocol", "PLAINTEXT").upper()
        if not upstream.startswith("SASL_"):
            raise ValueError(
                "http_auth=kafka logs each caller in to upstream Kafka, so upstream must be "
                f"SASL_SSL or SASL_PLAINTEXT (kafka_security_protocol or upstream_config's "
                f"security.protocol; it is {upstream})"
            )
        return self

    @property
    def https(self) -> bool:
        """Whether the HTTP API serves HTTPS (``http_tls_cert`` and ``http_tls_key``)."""
        return self.http_tls_cert is not None and self.http_tls_key is not None
