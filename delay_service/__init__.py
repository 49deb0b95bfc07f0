"""The delay service: a replica that stores the buffer topic in RocksDB and, as master, forwards.

Modules: ``entry`` (an entry's key and value format), ``store`` (RocksDB pending set) with
``ids`` (its index by id and buffer key),
``ingest`` (buffer topic -> store), ``forwarder`` (master loop) with ``round`` (planning a
round), ``retry`` (retry and dead-letter policy) and ``sender`` (every produce to Kafka),
``clock`` and ``broker_clock`` (the broker's time, never ahead), ``replica`` (wiring,
election), ``metrics``, ``config``, ``cli``.
"""

from __future__ import annotations

from delay_service.config import ReplicaConfig
from delay_service.entry import Entry
from delay_service.errors import StoreError
from delay_service.store import Store

__all__ = ["Entry", "ReplicaConfig", "Store", "StoreError"]
