"""The verifier's configuration: flags > ``KDELAY_VERIFIER_*`` environment > config file."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from kdelay.buffer import BUFFER_TOPIC
from kdelay.config import component_config
from kdelay.durations import duration_ms

OUTPUT_TOPIC = "__kdelay_verifier"


class VerifierConfig(BaseSettings):
    """Everything ``kdelay verify`` needs; validated once at start-up."""

    model_config = component_config("KDELAY_VERIFIER_")

    bootstrap_servers: str = "127.0.0.1:9092"
    buffer_topic: str = BUFFER_TOPIC
    #: Comma-separated target topics; empty = the "t" values found in the buffer topic.
    topics: str = ""
    #: A message counts as missing only when its due time is older than end-of-input - grace;
    #: in the streaming job it is also the watermark delay of both inputs.
    grace_ms: int = Field(default=30_000, ge=0)
    #: Event-time window (over the due time) of the per-window results.
    window: str = "10s"
    #: Streaming only: how long before its due time a delivery can still be matched to its
    #: message (an earlier one stays unmatched, and the message counts missing). It bounds the
    #: join state, and window results come out about max(grace, horizon) after the due time.
    early_horizon_ms: int = Field(default=60_000, ge=0)
    #: Prometheus port; 0 = no metrics server.
    metrics_port: int = Field(default=0, ge=0, le=65535)
    metrics_host: str = "0.0.0.0"
    #: Per-window JSON files go to ``<output_dir>/windows``; nothing when unset.
    output_dir: Path | None = None
    #: Window results are also produced to this topic; "" = no Kafka output.
    output_topic: str = OUTPUT_TOPIC
    #: Print each window result on stdout.
    console: bool = True
    #: Streaming checkpoint (offsets and join/aggregation state); a temporary one when unset.
    checkpoint_dir: Path | None = None
    #: Streaming micro-batch interval.
    trigger: str = "2s"
    #: Where a new streaming query starts reading ("earliest" or "latest").
    starting_offsets: str = "earliest"
    #: --once only: the end-of-input instant (epoch ms) that decides missing; now when unset.
    end_ms: int | None = None
    spark_master: str = "local[2]"
    driver_memory: str = "1g"
    shuffle_partitions: int = Field(default=4, gt=0)
    log_level: str = "INFO"

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

    @property
    def window_ms(self) -> int:
        return duration_ms(self.window)

    @property
    def trigger_ms(self) -> int:
        return duration_ms(self.trigger)

    @property
    def topic_list(self) -> list[str]:
        return [t.strip() for t in self.topics.split(",") if t.strip()]
