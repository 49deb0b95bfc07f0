"""Keeping a long-running process's heap from creeping (glibc's allocator), and its garbage
collector from pausing on what start-up built.

glibc gives each thread that allocates concurrently its own arena, up to eight per core, and
returns freed memory at the top of an arena only. A replica runs librdkafka's, RocksDB's and
its own Python threads, so its resident set grew for half an hour in anonymous arenas that
held little live data (``bench/soak.py``). Two arenas and a periodic ``malloc_trim`` keep it
flat. Elsewhere than glibc (musl, macOS) both calls do nothing.

Python's cyclic collector walks every tracked object in a full collection, and a process
that allocates per record runs one every second or so. The proxy's walked the modules,
classes and configuration of its start-up each time: 49-56 ms with every request stopped
(``bench.proxy``); a replica's, 28-68 ms with ingest and release stopped (a burst's forward
rate rose by a fifth without them, ``bench.delay_service``). :func:`freeze_startup_objects`
moves them out of its reach once started. A replica also collects its young generation less
often (:func:`collect_young_less_often`): a release round builds tens of thousands of short-
lived objects, none of them in a cycle, and each collection of 700 walked what the round still
held (5.5% of a released record's instructions, ``bench.forward_cpu``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from functools import cache

_M_ARENA_MAX = -8  # mallopt parameter, <malloc.h>

#: A replica's first-generation threshold (CPython's default: 700 allocations).
YOUNG_THRESHOLD = 50_000

#: How often a long-running process returns free heap memory (seconds).
TRIM_INTERVAL_S = 30.0


@cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt  # noqa: B018 - probe: glibc only
        libc.malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def limit_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas; call before the process starts its threads. True if applied."""
    libc = _glibc()
    return libc is not None and bool(libc.mallopt(_M_ARENA_MAX, arenas))


def trim() -> bool:
    """Return free heap memory to the system. True if some was released."""
    libc = _glibc()
    return libc is not None and bool(libc.malloc_trim(0))


def freeze_startup_objects() -> int:
    """Collect once, then move every object still alive (what start-up built: modules, classes,
    configuration, connections) into the collector's permanent generation, which later
    collections do not walk (``gc.freeze``; they stay alive, as they would anyway). Call it
    when the process is serving. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def collect_young_less_often(threshold: int = YOUNG_THRESHOLD) -> None:
    """Collect the youngest generation every ``threshold`` net allocations instead of 700 (the
    older generations' thresholds stay): for a process whose per-record objects are not cycles,
    fewer walks of what is still alive; a cycle is still freed, a little later."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)
