"""The delay service: a replica that stores the buffer topic in RocksDB and, as master, forwards.

Modules: ``store`` (RocksDB pending set), ``ingest`` (buffer topic -> store), ``forwarder``
(master loop), ``replica`` (wiring, election), ``metrics``, ``config``, ``cli``.
"""

from __future__ import annotations

from delay_service.config import ReplicaConfig
from delay_service.errors import ForwarderStopped, StoreError
from delay_service.store import Entry, Store

__all__ = ["Entry", "ForwarderStopped", "ReplicaConfig", "Store", "StoreError"]
