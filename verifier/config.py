"""The verifier's configuration: flags > ``KDELAY_VERIFIER_*`` environment > config file."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings

from kdelay.buffer import BUFFER_TOPIC
from kdelay.config_loader import component_config
from kdelay.durations import duration_ms
from kdelay.kafka_security import KafkaClientSecurity

OUTPUT_TOPIC = "__kdelay_verifier"
READ_UNCOMMITTED = "read_uncommitted"
READ_COMMITTED = "read_committed"


class VerifierConfig(BaseSettings, KafkaClientSecurity):
    """Everything ``kdelay verify`` needs; validated once at start-up."""

    model_config = component_config("KDELAY_VERIFIER_")

    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="Kafka bootstrap servers")
    buffer_topic: str = Field(default=BUFFER_TOPIC, description="the buffer topic")
    topics: str = Field(
        default="", description="comma-separated target topics [those the buffer names]"
    )
    grace_ms: int = Field(
        default=30_000,
        ge=0,
        description="missing only when due + grace < end of input; the streaming watermark delay",
    )
    window: str = Field(default="10s", description="event-time window (over due time) of results")
    # Streaming: an earlier delivery stays unmatched (its message counts missing, the delivery
    # still counts early); it bounds the join state, and window results come out about
    # max(grace, horizon) after the due time.
    early_horizon_ms: int = Field(
        default=60_000, ge=0, description="streaming: how early a delivery still matches"
    )
    metrics_port: int = Field(default=0, ge=0, le=65535, description="Prometheus port (0: none)")
    metrics_host: str = Field(default="0.0.0.0", description="Prometheus bind address")
    output_dir: Path | None = Field(
        default=None, description="per-window JSON files go to <dir>/windows"
    )
    output_topic: str = Field(
        default=OUTPUT_TOPIC, description="topic for window results ('' for none)"
    )
    console: bool = Field(default=True, description="print window results on stdout")
    checkpoint_dir: Path | None = Field(
        default=None, description="streaming checkpoint (offsets, state) [a temporary one]"
    )
    trigger: str = Field(default="2s", description="streaming micro-batch interval")
    starting_offsets: str = Field(
        default="earliest", description="where a new streaming query starts: earliest or latest"
    )
    # Kafka's consumer isolation.level, passed to Spark's Kafka source as kafka.isolation.level:
    # read_committed hides records of aborted (and still open) transactions, as a
    # read_committed consumer of the target topics would see them.
    # read_committed by default: what a consumer of exactly-once releases reads; read_uncommitted
    # counts what a non-transactional consumer would also see (aborted copies).
    isolation_level: str = Field(
        default=READ_COMMITTED,
        description="consumer isolation level: read_committed, or read_uncommitted to count "
        "what a non-transactional consumer would see too",
    )
    end_ms: int | None = Field(
        default=None,
        description="--once: end-of-input instant, epoch ms, that decides missing [now]",
    )
    spark_master: str = Field(default="local[2]", description="Spark master URL")
    driver_memory: str = Field(default="1g", description="Spark driver memory")
    executor_memory: str = Field(
        default="1g", description="Spark executor memory (spark:// and k8s:// masters)"
    )
    executor_cores: int = Field(
        default=1, gt=0, description="cores per Spark executor (spark:// and k8s:// masters)"
    )
    kubernetes_image: str = Field(
        default="", description="k8s:// masters: the executors' container image (required there)"
    )
    executor_instances: int = Field(
        default=2, gt=0, description="k8s:// masters: the executor pods (spark.executor.instances)"
    )
    kubernetes_namespace: str = Field(
        default="default", description="k8s:// masters: the executor pods' namespace"
    )
    kubernetes_driver_pod: str = Field(
        default="",
        description="k8s:// masters, driver in a pod: its name, so the executor pods are owned "
        "by it and deleted with it (spark.kubernetes.driver.pod.name)",
    )
    driver_host: str = Field(
        default="127.0.0.1",
        description="the address the driver listens on and executors reach it at (in a pod: "
        "the pod's IP)",
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description="further Spark settings, applied last (e.g. "
        "spark.kubernetes.executor.request.cores)",
    )
    shuffle_partitions: int = Field(default=4, gt=0, description="spark.sql.shuffle.partitions")
    checkpoint_batches_retained: int = Field(
        default=20,
        ge=2,
        description="streaming: the micro-batches whose offsets and state the checkpoint keeps "
        "(spark.sql.streaming.minBatchesToRetain; Spark's default, 100, let a soak's checkpoint "
        "grow by 2 MB a batch for 100 batches)",
    )
    log_level: str = Field(default="INFO", description="DEBUG, INFO, WARNING or ERROR")

    @field_validator("window", "trigger")
    @classmethod
    def _duration(cls, value: str) -> str:
        if duration_ms(value) <= 0:
            raise ValueError("must be longer than 0 ms")
        return value

    @field_validator("starting_offsets")
    @classmethod
    def _offsets(cls, value: str) -> str:
        if value not in ("earliest", "latest"):
            raise ValueError("must be 'earliest' or 'latest'")
        return value

    @field_validator("isolation_level")
    @classmethod
    def _isolation(cls, value: str) -> str:
        if value not in (READ_UNCOMMITTED, READ_COMMITTED):
            raise ValueError(f"must be {READ_UNCOMMITTED!r} or {READ_COMMITTED!r}")
        return value

    @model_validator(mode="after")
    def _ca_readable(self) -> VerifierConfig:
        self.kafka_ca_pem()  # at start, naming the setting, not in an executor's first task
        return self

    def kafka_ca_pem(self) -> str | None:
        """The PEM CA bundle of ``kafka_ssl_ca_file`` when the protocol uses TLS. Spark's
        executors get its text (``kafka.ssl.truststore.certificates``), not its path: on a
        cluster they run where the driver's file is not."""
        path = self.kafka_client_config().get("ssl.ca.location")
        if path is None:
            return None
        try:
            pem = Path(path).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not a PEM file (ASCII)"
            raise ValueError(f"kafka_ssl_ca_file: cannot read {path}: {reason}") from None
        if "-----BEGIN CERTIFICATE-----" not in pem:
            raise ValueError(f"kafka_ssl_ca_file: {path} holds no PEM certificate")
        return pem

    @property
    def window_ms(self) -> int:
        return duration_ms(self.window)

    @property
    def trigger_ms(self) -> int:
        return duration_ms(self.trigger)

    @property
    def topic_list(self) -> list[str]:
        return [t.strip() for t in self.topics.split(",") if t.strip()]
