"""The delay service: a replica that stores the buffer topic in RocksDB and, as master, forwards.

Rooms, each a package, in layers (a room imports only those below it; ARCHITECTURE.md):
``cli``, ``replica`` (wiring, election, the control loop), ``startup``, ``health`` (the HTTP
port) and ``status`` (the status znode), ``threads`` (the supervised threads); ``reshard``
(changing the shard count, each replica's shard directory); ``release`` (the master's loop and
every produce to Kafka), ``ingest`` (the buffer topic into the store) and ``queries`` (what a
replica answers about messages), which never import one another; ``store`` (the RocksDB pending
set, its keyspace, ids index, open cancels, outcomes and tombstones); and the base: ``config``,
``errors``, ``metrics``, ``away`` (the store's away stamp) and ``zk_flags`` (the commands'
ZooKeeper login flags).

Modules: ``cli``, ``replica``, ``startup``, ``health``, ``status``, ``threads``, ``reshard``,
``release``, ``ingest``, ``queries``, ``store``, ``config``, ``errors``, ``metrics``, ``away``,
``zk_flags``.
"""

from __future__ import annotations

from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.errors import StoreError
from kdelay.delay_service.store.entry import Entry
from kdelay.delay_service.store.store import Store

__all__ = ["Entry", "ReplicaConfig", "Store", "StoreError"]
