"""The replica's Prometheus metrics (docs/metrics.md, ``kdelay_replica_*``); health.py serves them.

Each replica process owns one :class:`Metrics` on its own registry, so tests can build several
in one interpreter. prometheus_client's metrics are thread-safe; any thread may update them.
"""

from __future__ import annotations

import itertools
import math
import threading
from bisect import bisect_left
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

#: Lateness buckets, seconds: a healthy master releases within milliseconds; a failover or a
#: restart shows up in the seconds-to-a-minute range.
LATENESS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
#: Round-phase buckets, seconds: a local broker answers within milliseconds; a slow or
#: overloaded one shows in the tens to hundreds.
ROUND_PHASE_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Release-smoothing delay buckets, seconds: a burst throttled to a topic's rate limit can
#: wait from milliseconds to hours (a million messages at 1,000/s: 1,000 s for the last one).
SMOOTHING_BUCKETS = (
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
)  # fmt: skip
#: Why a master stepped down (``kdelay_replica_step_downs_total``).
STEP_DOWN_REASONS = ("clock_skew", "forwarder_failed")
#: The phases of an exactly-once round (``kdelay_replica_round_phase_seconds``).
ROUND_PHASES = ("send", "acks", "commit")
#: The ``within`` windows of ``kdelay_replica_due_messages``, in milliseconds (replica.py counts
#: at most 50,000 entries per refresh: a window that reaches it reads 50,000, "at least").
DUE_WINDOWS = {
    "1s": 1_000,
    "10s": 10_000,
    "1m": 60_000,
    "10m": 600_000,
    "1h": 3_600_000,
    "1d": 86_400_000,
}
ZK_STATES = ("connected", "suspended", "lost")


class BatchHistogram(Collector):
    """A histogram that takes a round's values at once (:meth:`observe_all`), exported as
    prometheus_client's own (``_bucket``, ``_sum``, ``_count``; no ``_created``).

    The master observes the lateness of every release, from the forwarder thread: where
    ``Histogram.observe`` makes two locked increments and walks the buckets for each value, a
    round here takes the lock once and each value costs a binary search of the bounds.
    Collection, on whichever thread serves ``/metrics``, takes the same lock.
    """

    def __init__(
        self, name: str, documentation: str, buckets: Iterable[float], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = (*sorted(buckets), math.inf)
        # prometheus_client's ``le`` labels: repr of the float, "+Inf" last
        self._labels = [*(repr(float(b)) for b in self._bounds[:-1]), "+Inf"]
        self._counts = [0] * len(self._bounds)  # per bucket, not cumulative
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_all((value,))

    def observe_all(self, values: Iterable[float]) -> None:
        bounds, counts = self._bounds, self._counts
        total = 0.0
        with self._lock:
            for value in values:
                counts[bisect_left(bounds, value)] += 1  # the first bucket with value <= le
                total += value
            self._sum += total

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._documentation)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative = itertools.accumulate(counts)
        buckets = [(le, float(c)) for le, c in zip(self._labels, cumulative, strict=True)]
        yield HistogramMetricFamily(
            self._name, self._documentation, buckets=buckets, sum_value=total
        )


class Metrics:
    """Every ``kdelay_replica_*`` metric of docs/metrics.md."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.pending = Gauge(
            "kdelay_replica_pending_messages", "entries in this replica's store", registry=r
        )
        self.due = Gauge(
            "kdelay_replica_due_messages",
            "pending entries due within the window (cumulative)",
            ["within"],
            registry=r,
        )
        self.ingested = Counter(
            "kdelay_replica_ingested", "buffer records ingested", ["kind"], registry=r
        )
        self.forwarded = Counter(
            "kdelay_replica_forwarded",
            "messages delivered to their target (master only)",
            registry=r,
        )
        self.cancelled = Counter(
            "kdelay_replica_cancelled", "pending messages removed by a cancel", registry=r
        )
        self.cancels_refused = Counter(
            "kdelay_replica_cancels_refused",
            "pending messages a cancel or replace left alone: another principal's (README "
            '"Message owners")',
            registry=r,
        )
        self.cancel_outcomes = Counter(
            "kdelay_replica_cancel_outcomes",
            "cancels of one id read, by what they found: cancelled (removed a pending message), "
            "already_delivered (none pending, the last with its id delivered), unknown",
            ["outcome"],
            registry=r,
        )
        for outcome in ("cancelled", "already_delivered", "unknown"):
            self.cancel_outcomes.labels(outcome)
        self.bulk_cancels = Counter(
            "kdelay_replica_bulk_cancels", "bulk cancels (by id prefix) read", registry=r
        )
        self.bulk_cancelled = Counter(
            "kdelay_replica_bulk_cancelled_messages",
            "pending messages bulk cancels cancelled (also in kdelay_replica_cancelled_total)",
            registry=r,
        )
        self.bulk_refused = Counter(
            "kdelay_replica_bulk_cancel_refused_messages",
            "messages a bulk cancel left alone: another principal's",
            registry=r,
        )
        self.dead_lettered = Counter(
            "kdelay_replica_dead_lettered",
            "messages sent to the dead-letter topic",
            ["reason"],
            registry=r,
        )
        self.forward_errors = Counter(
            "kdelay_replica_forward_errors",
            "forwarding attempts that failed (retried or dead-lettered)",
            ["error"],
            registry=r,
        )
        self.transactions = Counter(
            "kdelay_replica_transactions",
            "exactly-once release rounds, by outcome (committed, aborted)",
            ["outcome"],
            registry=r,
        )
        self.lateness = BatchHistogram(
            "kdelay_replica_lateness_seconds",
            "release time - due time of each forwarded message",
            LATENESS_BUCKETS,
            r,
        )
        self.round_phase = Histogram(
            "kdelay_replica_round_phase_seconds",
            "how long each phase of an exactly-once release round took: send (open the "
            "transaction, produce its records), acks (wait for their acknowledgements), commit "
            "(the tombstones and the checkpoint, then commit_transaction); a message due while "
            "a round runs waits for its end",
            ["phase"],
            buckets=ROUND_PHASE_BUCKETS,
            registry=r,
        )
        for phase in ROUND_PHASES:
            self.round_phase.labels(phase)
        self.buffer_lag = Gauge(
            "kdelay_replica_buffer_lag_messages",
            "buffer-topic records not yet ingested (sum over partitions)",
            registry=r,
        )
        self.checkpoint_age = Gauge(
            "kdelay_replica_checkpoint_age_seconds",
            "now - time of the last checkpoint this replica saw or wrote",
            registry=r,
        )
        self.is_master = Gauge("kdelay_replica_is_master", "1 on the master, else 0", registry=r)
        self.shard_info = Gauge(
            "kdelay_replica_shard_info",
            "1, labelled with the replica's shard and the delay set's shard count (join on "
            "instance to group any replica metric by shard)",
            ["shard", "shards"],
            registry=r,
        )
        self.checkpoint_rejected = Counter(
            "kdelay_replica_checkpoint_rejected",
            "checkpoint writes rejected or unconfirmed by ZooKeeper (the master stepped down)",
            registry=r,
        )
        self.zk_state = Gauge(
            "kdelay_replica_zk_state",
            "1 for the current ZooKeeper connection state",
            ["state"],
            registry=r,
        )
        self.store_bytes = Gauge("kdelay_replica_store_bytes", "RocksDB size on disk", registry=r)
        # -- never stuck: poison records, supervised threads, ingest progress ---------------------
        self.invalid_records = Counter(
            "kdelay_replica_invalid_records",
            "buffer records this replica could not decode or store (dead-lettered)",
            ["reason"],
            registry=r,
        )
        self.component_failures = Counter(
            "kdelay_component_failures",
            "unexpected exceptions that ended a supervised thread (restarted or the process ends)",
            ["component"],
            registry=r,
        )
        self.ingest_progress_age = Gauge(
            "kdelay_replica_ingest_last_progress_seconds",
            "seconds since ingest last applied records or found itself at the end of the buffer",
            registry=r,
        )
        # -- per-target isolation: held targets, records in flight, dead letters -----------------
        self.targets_held = Gauge(
            "kdelay_replica_targets_held",
            "release targets (topic, partition) with records in flight or a retry backoff "
            "running at the end of the last round (master only)",
            registry=r,
        )
        self.in_flight = Gauge(
            "kdelay_replica_in_flight_messages",
            "records produced and not yet acknowledged at the end of the last round",
            registry=r,
        )
        self.dead_letter_errors = Counter(
            "kdelay_replica_dead_letter_errors",
            "dead-letter writes that failed (the entry backs off and is tried again)",
            ["error"],
            registry=r,
        )
        # -- one clock, Kafka's: probes of the broker's clock (broker_clock.py) ------------------
        self.clock_skew = Gauge(
            "kdelay_clock_skew_seconds",
            "this process's wall clock minus the broker's clock (positive: local clock ahead)",
            registry=r,
        )
        self.clock_uncertainty = Gauge(
            "kdelay_clock_uncertainty_seconds",
            "round trip of the latest broker-clock probe: the width of the broker-time bounds",
            registry=r,
        )
        self.release_held = Gauge(
            "kdelay_replica_release_held",
            "1 while the master holds every release (its clock is past --max-clock-skew-ms "
            "from the broker's, or the broker's clock is not known yet)",
            registry=r,
        )
        self.step_downs = Counter(
            "kdelay_replica_step_downs",
            "times this replica stepped down as master, by reason (clock_skew: held past "
            "--skew-step-down-ms; forwarder_failed)",
            ["reason"],
            registry=r,
        )
        self.clock_probe_failures = Counter(
            "kdelay_clock_probe_failures",
            "broker-clock probes that failed (Kafka unreachable, timed out, topic not "
            "LogAppendTime)",
            registry=r,
        )
        # -- release smoothing: a rate limit per target topic (smoothing.py) -----------------------
        self.release_rate_limit = Gauge(
            "kdelay_replica_release_rate_limit",
            'configured release rate limit, messages per second per target topic (topic="*": '
            "--release-rate-limit, every topic without its own in release_rate_limits)",
            ["topic"],
            registry=r,
        )
        self.release_throttled = Counter(
            "kdelay_replica_release_throttled",
            "messages released later than they were due because their target topic's release "
            "rate limit held them back (master only)",
            ["topic"],
            registry=r,
        )
        self.release_smoothing_delay = Histogram(
            "kdelay_replica_release_smoothing_delay_seconds",
            "lateness (release time - due time) of the messages a release rate limit held back: "
            "the extra lateness smoothing costs, per target topic",
            ["topic"],
            buckets=SMOOTHING_BUCKETS,
            registry=r,
        )
        self.release_throttled_topics = Gauge(
            "kdelay_replica_release_throttled_topics",
            "target topics whose release rate limit held due messages back in the last round",
            registry=r,
        )
        self._acl_metrics(r)
        for reason in ("undecodable", "unstorable"):
            self.invalid_records.labels(reason)
        for component in ("ingest", "forwarder"):
            self.component_failures.labels(component)
        for reason in STEP_DOWN_REASONS:
            self.step_downs.labels(reason)
        for kind in ("schedule", "cancel", "tombstone", "invalid"):
            self.ingested.labels(kind)
        for window in (*DUE_WINDOWS, "inf"):
            self.due.labels(window)
        self.set_zk_state("lost")

    def _acl_metrics(self, r: CollectorRegistry) -> None:
        """What the master asks of Kafka's ACLs: owners' WRITE, the buffer's writers."""
        # -- revocation: owners' WRITE asked of Kafka before a release (owner_acls.py) ------------
        self.owner_refused = Counter(
            "kdelay_replica_owner_refused",
            "releases refused because the message's owner may no longer WRITE its target by "
            "Kafka's ACLs (sent to the dead-letter topic instead)",
            registry=r,
        )
        self.owner_acl_failures = Counter(
            "kdelay_replica_owner_acl_failures",
            "questions to Kafka about a target topic's ACLs (DescribeAcls) that failed or did "
            "not answer: its owned messages stay pending",
            registry=r,
        )
        self.owner_unchecked = Gauge(
            "kdelay_replica_owner_unchecked_messages",
            "due messages the last round held because their owner's ACLs could not be asked",
            registry=r,
        )
        self.buffer_foreign_writers = Gauge(
            "kdelay_replica_buffer_foreign_writers",
            "Kafka ACL bindings letting a principal other than kdelay's buffer writers WRITE "
            "the buffer topic (last asked by the master, which releases nothing while > 0)",
            registry=r,
        )

    def set_zk_state(self, state: str) -> None:
        for name in ZK_STATES:
            self.zk_state.labels(name).set(1 if name == state else 0)
