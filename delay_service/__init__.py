"""The delay service: a replica that stores the buffer topic in RocksDB and, as master, forwards.

Modules: ``entry`` (an entry's key and value format), ``store`` (RocksDB pending set: its
``store_state``, ``store_scans`` and ``store_writes``, whose ``apply_result`` says what an apply
did) with ``ids`` (its index by id and buffer key) and ``cancels`` (the open cancels' rule;
``cancel_keys`` their keys and formats), ``ingest`` (buffer topic -> store), ``forwarder``
(master loop; ``forwarder_control`` what other threads ask of it) with ``round`` (planning a
round), ``delivery_reports`` (settling what completed), ``release_backoff`` (backoff and
dead-letter policy) and ``sender`` (every produce to Kafka: ``producer``, ``in_flight``,
``series``), ``broker_clock`` (the broker's time, never ahead: :mod:`kdelay.broker_clock`),
``replica`` (wiring, election, the control loop; ``startup``, ``status``, ``threads``,
``follower_checkpoints``), ``queries`` (what a replica answers about messages: ``timeline``,
``listing``), ``metrics``, ``config``, ``cli``.
"""

from __future__ import annotations

from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.entry import Entry
from kdelay.delay_service.errors import StoreError
from kdelay.delay_service.store import Store

__all__ = ["Entry", "ReplicaConfig", "Store", "StoreError"]
