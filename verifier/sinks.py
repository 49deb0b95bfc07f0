"""Where window results go: stdout, JSON files, a Kafka topic and Prometheus.

One :class:`Sinks` per run, called from one thread at a time (the streaming job's
foreachBatch thread, or the ``--once`` driver). A file is written to a temporary name and
renamed, so a reader never sees half of one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from kdelay import logs
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.metrics import Metrics
from kdelay.verifier.report import WindowResult

log = logs.get(__name__)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


class Sinks:
    """Publishes each batch of window results to every configured output."""

    def __init__(self, cfg: VerifierConfig, metrics: Metrics | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.windows_dir = cfg.output_dir / "windows" if cfg.output_dir else None
        self._producer: Producer | None = None
        if cfg.output_topic:
            self._producer = Producer(
                {**cfg.kafka_connection(cfg.bootstrap_servers), "acks": "all", "linger.ms": 5}
            )
        self._errors: list[str] = []

    def publish(
        self,
        name: str,
        windows: list[WindowResult],
        lateness_ms: list[float],
        *,
        console: bool | None = None,
    ) -> None:
        """Send one batch (``name``: e.g. ``batch-000007`` or ``once``) everywhere."""
        records = [{"batch": name, **w.as_dict()} for w in windows]
        if console if console is not None else self.cfg.console:
            for rec in records:
                sys.stdout.write(json.dumps(rec, separators=(",", ":")) + "\n")
            sys.stdout.flush()
        if self.windows_dir is not None:
            write_json(self.windows_dir / f"{name}.json", records)
        if self._producer is not None:
            self._produce(records)
        if self.metrics is not None:
            self.metrics.record((w.summary for w in windows), lateness_ms)

    def _produce(self, records: list[dict[str, Any]]) -> None:
        assert self._producer is not None

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                self._errors.append(str(err))

        for rec in records:
            self._producer.produce(
                self.cfg.output_topic,
                json.dumps(rec, separators=(",", ":")).encode(),
                str(rec["window_start_ms"]).encode(),
                on_delivery=on_delivery,
            )
        left = self._producer.flush(30)
        if left or self._errors:
            # An output topic that cannot be written must not stop verification.
            log.warning(
                "verifier.output_topic_failed",
                topic=self.cfg.output_topic,
                unacknowledged=left,
                errors=self._errors[:3],
            )
            self._errors.clear()

    def close(self) -> None:
        """Deliver what is queued (up to 10 s) and close the Kafka client: Spark may keep this
        object alive after the query stops, and an open client would keep reconnecting."""
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(10)
            producer.close()
