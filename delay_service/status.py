"""What a replica tells the others: its status znode, its role, and the gauges behind them.

Every ``status_interval_ms`` the replica's control loop calls :meth:`StatusPublisher.publish`:
it sets the pending, store-size, due-window and checkpoint-age gauges and publishes the status
document (name, shard, role, lag, pending, offsets, metrics URL, candidate node, pid, time) in
ZooKeeper for ``kdelay status`` and ``zk/replica_api.py``. The due-window counts scan the store
under its lock, so they are refreshed only every :data:`DUE_REFRESH_S`.

Threads: :meth:`StatusPublisher.publish` runs on the control thread only; :func:`role` may be
called from any thread (the HTTP port's message queries ask it).
"""

from __future__ import annotations

import os
import time

from kdelay import logs
from kdelay.broker_clock import BrokerClock
from kdelay.checkpoint import CheckpointRecord
from kdelay.clock import now_ms
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.ingest.ingest import Ingest
from kdelay.delay_service.metrics import DUE_WINDOWS, Metrics
from kdelay.delay_service.release.forwarder import Forwarder
from kdelay.delay_service.store.store import Store
from kdelay.zk import CoordinationError, Election, Registry

log = logs.get(__name__)

_DUE_CAP = 50_000
#: How often the due-window gauges are recounted: the scan holds the store's lock, so not on
#: every status publish (a 100k-message burst released at half speed when it was).
DUE_REFRESH_S = 10.0


def role(forwarder: Forwarder, ingest: Ingest) -> str:
    """``master`` (forwarding), ``follower`` (caught up) or ``catching-up``; any thread."""
    if forwarder.active.is_set():
        return "master"
    return "follower" if ingest.caught_up.is_set() else "catching-up"


class StatusPublisher:
    """Publishes one replica's status and refreshes its gauges."""

    def __init__(
        self, cfg: ReplicaConfig, metrics: Metrics, metrics_url: str, clock: BrokerClock
    ) -> None:
        self._cfg = cfg
        self._metrics = metrics
        self._metrics_url = metrics_url
        self._clock = clock
        self._due_next = 0.0  # monotonic: when the due-window gauges are next recounted

    def publish(  # noqa: PLR0917 - the replica's parts, each read once
        self,
        registry: Registry,
        store: Store,
        ingest: Ingest,
        forwarder: Forwarder,
        election: Election,
        last_checkpoint: CheckpointRecord | None,
    ) -> None:
        """Set the gauges and publish the status document; ``last_checkpoint`` is the last
        checkpoint this replica read from ZooKeeper (a follower's checkpoint age)."""
        pending = store.pending
        lag = ingest.lag()
        current = role(forwarder, ingest)
        now = self._clock.now_ms() or now_ms()
        m = self._metrics
        m.pending.set(pending)
        m.store_bytes.set(store.size_bytes())
        if time.monotonic() >= self._due_next:
            self._due_next = time.monotonic() + DUE_REFRESH_S
            counts = store.count_due_within(now, list(DUE_WINDOWS.values()), _DUE_CAP)
            for label, count in zip(DUE_WINDOWS, counts, strict=True):
                m.due.labels(label).set(count)
        m.due.labels("inf").set(pending)
        if forwarder.active.is_set():
            m.checkpoint_age.set(max(0.0, (now - forwarder.last_checkpoint_ms) / 1000))
        elif last_checkpoint is not None:
            m.checkpoint_age.set(max(0.0, (now - last_checkpoint.written_at_ms) / 1000))
        status = {
            "name": self._cfg.name,
            "shard": self._cfg.shard,
            "role": current,
            "lag": lag,
            "pending": pending,
            "offsets": {str(p): o for p, o in sorted(store.offsets().items())},
            "metrics": self._metrics_url,
            "candidate": election.node,
            "pid": os.getpid(),
            "updated_ms": now,
        }
        try:
            registry.publish(status)
        except CoordinationError as exc:
            log.warning("replica.status_not_published", error=str(exc))
