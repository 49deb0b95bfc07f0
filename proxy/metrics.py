"""The proxy's Prometheus metrics, exactly as named in docs/metrics.md.

Under ``kdelay proxy --workers N`` (proxy/workers.py) every worker process records its values in
files under ``PROMETHEUS_MULTIPROC_DIR`` (prometheus-client's multiprocess mode, chosen when the
library is imported) and :meth:`ProxyMetrics.exposition` reports all workers together: counters
and histograms summed, gauges summed over the live workers (``upstream_available``: their
minimum).
"""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from kdelay.proxy.limits import LIMIT_SETTINGS
from kdelay.proxy.sasl import MECHANISMS

#: Reasons besides a limit (whose reason is the limit's setting name): a malformed control
#: header or a plain record for the buffer topic; a batch refused before its records are read
#: (framing, CRC, codec, unknown partition, transactional); a sequence or epoch refused.
REJECT_REASONS = ("invalid_record", "invalid_batch", "producer_state", "buffer_unavailable")
#: The supervised components (proxy/restarts.py).
COMPONENTS = ("upstream_poll", "http", "kafka_listener")

#: Produce latency: sub-millisecond (in-memory paths) to seconds (upstream trouble).
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
)


class ProxyMetrics:
    """One set of metrics in its own registry (several proxies may share a test process)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "kdelay_proxy_requests_total",
            "Kafka-protocol requests handled",
            ["api", "version", "result"],
            registry=r,
        )
        self.records = Counter("kdelay_proxy_records_total", "Records routed", ["kind"], registry=r)
        self.bytes = Counter(
            "kdelay_proxy_bytes_total",
            "Kafka-protocol bytes read from / written to clients",
            ["direction"],
            registry=r,
        )
        self.produce_latency = Histogram(
            "kdelay_proxy_produce_latency_seconds",
            "Produce request received to response sent",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "kdelay_proxy_upstream_errors_total",
            "Errors from upstream Kafka",
            ["error"],
            registry=r,
        )
        self.upstream_available = Gauge(
            "kdelay_proxy_upstream_available",
            "1 while upstream Kafka is reachable, 0 while it is down (proxy/availability.py)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.upstream_available.set(1)
        self.connections = Gauge(
            "kdelay_proxy_connections",
            "Open client connections",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.buffered_request_bytes = Gauge(
            "kdelay_proxy_buffered_request_bytes",
            "Request bytes reserved in memory, all connections (max_buffered_request_bytes)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.buffered_request_limit = Gauge(
            "kdelay_proxy_buffered_request_limit_bytes",
            "The max_buffered_request_bytes setting",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.buffered_request_waiting = Gauge(
            "kdelay_proxy_buffered_request_waiting",
            "Connections and HTTP requests waiting for memory before reading a request body",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.http_requests = Counter(
            "kdelay_proxy_http_requests_total",
            "HTTP API requests",
            ["method", "route", "status"],
            registry=r,
        )
        self.records_rejected = Counter(
            "kdelay_proxy_records_rejected_total",
            "Records rejected (nothing of their batch written), by reason",
            ["reason"],
            registry=r,
        )
        self.component_failures = Counter(
            "kdelay_component_failures_total",
            "Unexpected failures of a long-running component (each restarted or fatal)",
            ["component"],
            registry=r,
        )
        self.producer_states = Gauge(
            "kdelay_proxy_producer_states",
            "Idempotent producers whose sequence state the proxy keeps",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.producer_evictions = Counter(
            "kdelay_proxy_producer_evictions_total",
            "Idempotent producers forgotten, by reason (ttl: idle too long, cap: too many)",
            ["reason"],
            registry=r,
        )
        # The broker clock that stamps acceptance (kdelay.broker_clock; README "Cancelling a
        # message"): the same three as a replica's, named for the proxy.
        self.clock_skew = Gauge(
            "kdelay_proxy_clock_skew_seconds",
            "This proxy's wall clock minus the broker's (positive: ahead); plays no part in "
            "acceptance stamps",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.clock_uncertainty = Gauge(
            "kdelay_proxy_clock_uncertainty_seconds",
            "Round trip of the latest broker-clock probe: how far an acceptance stamp may run "
            "ahead of the broker's clock",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.clock_probe_failures = Counter(
            "kdelay_proxy_clock_probe_failures",
            "Broker-clock probes that failed",
            registry=r,
        )
        # Reasons and mechanisms: docs/metrics.md (set by proxy/kafka/auth_session.py).
        self.auth_failures = Counter(
            "kdelay_proxy_auth_failures_total",
            "Failed SASL logins on the Kafka listener, by mechanism and reason",
            ["mechanism", "reason"],
            registry=r,
        )
        self.authentications = Counter(
            "kdelay_proxy_authentications_total",
            "Successful SASL logins on the Kafka listener (kind: login or reauthentication)",
            ["mechanism", "kind"],
            registry=r,
        )
        self.bytes_in = self.bytes.labels("in")
        self.bytes_out = self.bytes.labels("out")
        # Known label values exist from the start, so dashboards and rate() see zeros.
        for path in ("immediate", "delayed"):
            self.produce_latency.labels(path)
        for mechanism in MECHANISMS:
            for kind in ("login", "reauthentication"):
                self.authentications.labels(mechanism, kind)
        #: The records counter's children by kind, looked up once (per-batch hot path).
        self.records_by_kind = {
            kind: self.records.labels(kind) for kind in ("immediate", "delayed", "cancel")
        }
        self.records.labels("rejected")
        for reason in (*LIMIT_SETTINGS, *REJECT_REASONS):
            self.records_rejected.labels(reason)
        for component in COMPONENTS:
            self.component_failures.labels(component)
        for eviction in ("ttl", "cap"):
            self.producer_evictions.labels(eviction)

    def rejected(self, reason: str, records: int) -> None:
        """Count ``records`` rejected for ``reason`` (both rejected-record counters)."""
        self.records.labels("rejected").inc(records)
        self.records_rejected.labels(reason).inc(records)

    def exposition(self) -> bytes:
        """The text exposition of these metrics: of every worker process when the proxy runs
        several (``PROMETHEUS_MULTIPROC_DIR`` is set), else of this registry."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            merged = CollectorRegistry()
            MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return bytes(generate_latest(merged))
        return bytes(generate_latest(self.registry))
