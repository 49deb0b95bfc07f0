"""A replica away longer than the buffer topic's ``delete.retention.ms`` rebuilds its store.

A replica resumes from the offsets its store holds. What was appended after them while it was
away it reads on return, except what the cleaner removed meanwhile: a message's cancel and the
tombstones that retire it are removed once they are older than ``delete.retention.ms`` (24 h by
default). A replica that held the message and comes back later would resume without ever
reading them, keep the message pending and, as master, deliver it. So the store remembers when
it last read its partitions to their end (``<data_dir>/synced.json``, written at most every
:data:`STAMP_EVERY_S` while ingest is at the end); a replica that starts more than the
retention, less a margin for clocks, after that instant removes its store and rebuilds it from
the topic, as an empty disk is (it joins the election only once caught up).

A store without the stamp (written by an older kdelay) is kept: its age is unknown.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kdelay import logs

log = logs.get(__name__)

STAMP_FILE = "synced.json"
#: How often, at most, the stamp is rewritten while ingest is at the end of its partitions.
STAMP_EVERY_S = 30.0
#: Kafka's default ``delete.retention.ms``: used when the topic's cannot be read.
DEFAULT_DELETE_RETENTION_MS = 86_400_000
#: The margin taken off the retention: clocks apart, the stamp's staleness (at most
#: :data:`STAMP_EVERY_S`), at most ten minutes and at most a tenth of the retention.
MAX_MARGIN_MS = 600_000


def margin_ms(retention_ms: int) -> int:
    """How much earlier than ``retention_ms`` a replica counts as away too long."""
    return min(MAX_MARGIN_MS, retention_ms // 10)


class SyncStamp:
    """Writes ``<data_dir>/synced.json`` when ingest reached the end (:meth:`synced`)."""

    def __init__(self, data_dir: Path, wall_ms: Callable[[], int] | None = None) -> None:
        self._path = data_dir / STAMP_FILE
        self._wall_ms = wall_ms or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._next = 0.0

    def synced(self) -> None:
        """Ingest has read every assigned partition to its end now (called by its thread)."""
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                return
            self._next = now + STAMP_EVERY_S
        write_stamp(self._path, self._wall_ms())


def write_stamp(path: Path, at_ms: int) -> None:
    """Record that the store held everything appended before ``at_ms`` (atomic replace)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"synced_at_ms": at_ms}) + "\n")
    tmp.replace(path)


def read_stamp(data_dir: Path) -> int | None:
    """When the store last read its partitions to the end, None if unknown."""
    try:
        value = json.loads((data_dir / STAMP_FILE).read_text())["synced_at_ms"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


def rebuild_if_away(
    data_dir: Path, store: Path, retention_ms: int, now_ms: int | None = None
) -> bool:
    """Remove ``store`` when its stamp is older than ``retention_ms`` less the margin; True if
    removed (module docstring)."""
    if not store.exists():
        return False
    synced = read_stamp(data_dir)
    if synced is None:
        return False
    now = int(time.time() * 1000) if now_ms is None else now_ms
    away = now - synced
    if away < retention_ms - margin_ms(retention_ms):
        return False
    log.warning(
        "replica.store_rebuilt",
        reason="away longer than the buffer topic's delete.retention.ms: cancels and "
        "tombstones appended meanwhile may have been removed",
        away_ms=away,
        delete_retention_ms=retention_ms,
        store=str(store),
    )
    shutil.rmtree(store)
    (data_dir / STAMP_FILE).unlink(missing_ok=True)
    return True
