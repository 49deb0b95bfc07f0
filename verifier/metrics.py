"""The verifier's Prometheus metrics (names as in docs/metrics.md).

Each instance has its own registry, so several verifiers (or tests) in one process do not
collide; :meth:`Metrics.serve` exposes it over HTTP. Updated from one thread at a time (the
streaming job's foreachBatch thread, or the ``--once`` driver).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from kdelay.verifier.report import Summary

#: Lateness buckets (seconds): from a millisecond to five minutes late.
LATENESS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)


class Metrics:
    """``kdelay_verifier_*`` counters and the lateness histogram."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.scheduled = Counter(
            "kdelay_verifier_scheduled", "scheduled messages seen in the buffer topic", registry=r
        )
        self.delivered = Counter(
            "kdelay_verifier_delivered", "deliveries matched to a scheduled message", registry=r
        )
        self.early = Counter(
            "kdelay_verifier_early",
            "deliveries before their due time (broker or receipt time)",
            registry=r,
        )
        self.duplicates = Counter(
            "kdelay_verifier_duplicates",
            "deliveries beyond the first of a message (id, due time)",
            registry=r,
        )
        self.missing = Counter(
            "kdelay_verifier_missing",
            "scheduled messages not delivered within the grace period",
            registry=r,
        )
        self.lateness = Histogram(
            "kdelay_verifier_lateness_seconds",
            "first delivery time (broker or receipt time) - due time",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )

    def serve(self, port: int, host: str) -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)

    def record(self, summaries: Iterable[Summary], lateness_ms: Iterable[float]) -> None:
        """Add window summaries (each message counted once) and observe their lateness."""
        for s in summaries:
            self.scheduled.inc(s.scheduled)
            self.delivered.inc(s.delivered)
            self.early.inc(s.early)
            self.duplicates.inc(s.duplicates)
            self.missing.inc(s.missing)
        for value in lateness_ms:
            self.lateness.observe(value / 1000.0)
