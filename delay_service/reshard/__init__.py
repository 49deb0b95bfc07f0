"""Reshard: changing the number of shards, and each replica's shard directory.

Modules: ``reshard`` (the fenced change), ``cli`` (``kdelay reshard``) and ``shard_dir`` (a
replica's store directory per shard).
"""
