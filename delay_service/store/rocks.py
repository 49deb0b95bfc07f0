"""The store's RocksDB options: bounded memory whatever the data.

Memtables of all column families share one cap, and one block cache holds the data, index and
filter blocks of every family, so neither the write rate nor the number of SST files makes a
replica's memory grow (``bench/soak.py`` samples it).

Every level is compressed with zstd (RocksDB's default is Snappy): a pending entry takes about
half the disk (docs/benchmarks.md, "Delay service"), for a few microseconds of CPU per block,
which ingest and release rates do not show.
"""

from __future__ import annotations

from typing import Any, cast

from rocksdict import BlockBasedIndexType, BlockBasedOptions, Cache, DBCompressionType, Options

from kdelay.delay_service.store.keyspace import CF_IDS, CF_OUTCOMES, COLUMN_FAMILIES

#: Memory all column families' memtables may hold before RocksDB flushes them.
MEMTABLE_BYTES = 32 << 20
#: One block cache for every family, holding their index and filter blocks too, so table
#: readers do not grow with the number of SST files.
BLOCK_CACHE_BYTES = 16 << 20
#: A memtable's whole-key Bloom filter in the families read by key, as a fraction of its size.
MEMTABLE_BLOOM_RATIO = 0.02


def _options(cache: Cache, *, bloom: bool = False) -> Options:
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    if bloom:  # the families read by key: an absent key costs no data block
        table.set_bloom_filter(10, False)
    # Partitioned index and filters: blocks of ~4 KB that the cache can hold. A whole-file
    # index or filter grows with the file (1 MB and more past a million entries) and outgrows
    # a shard of the 16 MB cache: it was read and parsed again on every lookup (155 us a key
    # read with 1M pending, against 1-12 us now; the release rate fell with the pending set).
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_top_level_index_and_filter(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    opts = Options(raw_mode=True)
    opts.set_block_based_table_factory(table)
    opts.set_compression_type(DBCompressionType.zstd())
    if bloom:  # an absent key costs no walk of the memtable's skip list either
        opts.set_memtable_whole_key_filtering(True)
        opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
    return opts


def options() -> tuple[Options, dict[str, Options]]:
    """The database options and those of the other column families."""
    cache = Cache(BLOCK_CACHE_BYTES)
    opts = _options(cache)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_db_write_buffer_size(MEMTABLE_BYTES)
    return opts, {
        name: _options(cache, bloom=name in (CF_IDS, CF_OUTCOMES)) for name in COLUMN_FAMILIES
    }


def multi_get(view: Any, keys: list[bytes]) -> list[bytes | None]:
    """The values of ``keys`` (None: absent) in one call: rocksdict's multi-get, which a list
    of keys selects, instead of a point read each."""
    return cast("list[bytes | None]", view.get(keys))
