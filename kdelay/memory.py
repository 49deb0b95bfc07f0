"""Keeping a long-running process's heap from creeping (glibc's allocator), and its garbage
collector from pausing on what start-up built. Why, and what it was measured to save:
docs/decisions/0006-memory-arenas-and-gc-freeze.md.

- :func:`limit_arenas`: cap glibc's malloc arenas. A replica calls it first thing, before any
  thread (librdkafka's, RocksDB's, its own) starts; :func:`trim` returns free heap memory to
  the system, which a replica's control thread does every :data:`TRIM_INTERVAL_S`. Elsewhere
  than glibc (musl, macOS) both do nothing and return False.
- :func:`freeze_startup_objects`: once serving, the proxy and a replica move what start-up
  built (modules, classes, configuration) out of the cyclic collector's full walks.
- :func:`collect_young_less_often`: a replica collects its young generation every
  :data:`YOUNG_THRESHOLD` allocations instead of 700, since a release round's many short-lived
  objects are not cycles.

The other three are called once, from the process's main thread, at start-up.
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
