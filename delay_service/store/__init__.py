"""The store: the replica's RocksDB pending set and everything kept in it.

Modules: ``store`` (the :class:`Store` callers use, composed of ``state``, ``writes``, ``scans``
and ``releases``; ``apply_result`` says what an apply did), ``keyspace`` (every column family's
keys and values: their prefixes and byte formats), ``entry`` (an entry and its key), ``ids`` (the
index by id and buffer key), ``cancels`` and ``bulk_cancels`` (the open cancels' rule; their keys
in ``cancel_keys``), ``outcomes`` (what became of each message), ``tombstones`` (records to
retire), ``owed_tombstones``, ``in_round`` (releases in flight), ``due_scan`` (what a due scan
returns) and ``rocks`` (the RocksDB options).
"""
