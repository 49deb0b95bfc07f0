"""delay_service.metrics.BatchHistogram: what a round's lateness values export must be what
prometheus_client's Histogram exports for the same values."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from kdelay.delay_service.metrics import LATENESS_BUCKETS, BatchHistogram, Metrics

#: Zero, values on bucket bounds (``le`` is inclusive), between them and past the last.
VALUES = [0.0, 0.001, 0.0011, 0.0025, 0.004, 0.01, 0.5, 1.0, 7.5, 60.0, 61.0, 3600.0]


def _exposition(registry: CollectorRegistry) -> list[str]:
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


def test_the_exposition_is_prometheus_clients_own() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("x_lateness_seconds", "doc", LATENESS_BUCKETS, ours)
    plain = Histogram("x_lateness_seconds", "doc", buckets=LATENESS_BUCKETS, registry=theirs)
    batch.observe_all(VALUES[:5])
    batch.observe_all([])
    batch.observe_all(v for v in VALUES[5:-1])
    batch.observe(VALUES[-1])
    for v in VALUES:
        plain.observe(v)
    assert _exposition(ours) == _exposition(theirs)
    assert 'x_lateness_seconds_bucket{le="0.001"} 2.0' in _exposition(ours)


def test_the_replicas_lateness_is_a_histogram_of_its_registry() -> None:
    metrics = Metrics()
    metrics.lateness.observe_all([0.02, 0.3])
    assert metrics.registry.get_sample_value("kdelay_replica_lateness_seconds_count") == 2
    assert (
        metrics.registry.get_sample_value("kdelay_replica_lateness_seconds_bucket", {"le": "0.025"})
        == 1
    )
    assert metrics.registry.get_sample_value("kdelay_replica_lateness_seconds_sum") == 0.32
