"""A buffer topic as Kafka's log cleaner leaves it, for rebuild tests (tests/unit/
test_compaction_rebuild.py): every partition keeps only the last record of each key, and a
key whose last record is a tombstone (null value) keeps nothing at all, as once
``delete.retention.ms`` has passed. The records are kept decoded (kdelay.buffer values)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kdelay.buffer import BufferRecord, Tombstone, decode
from tests.support.fakes import Sent


@dataclass
class Log:
    """One buffer topic: per partition, ``(offset, key, record)`` in offset order."""

    partitions: dict[int, list[tuple[int, bytes, BufferRecord]]] = field(default_factory=dict)

    def append(self, partition: int, key: bytes, record: BufferRecord) -> int:
        """Append one record; returns its offset."""
        log = self.partitions.setdefault(partition, [])
        offset = log[-1][0] + 1 if log else 0
        log.append((offset, key, record))
        return offset

    def append_tombstones(self, sent: list[Sent]) -> list[tuple[int, int, BufferRecord]]:
        """Append the tombstones a master produced (records with a null value); returns them
        as ``(partition, offset, record)``, as a replica reads them."""
        out: list[tuple[int, int, BufferRecord]] = []
        for s in sent:
            if s.value is None:
                assert s.key is not None
                headers = [(k, v.encode() if isinstance(v, str) else v) for k, v in s.headers]
                record = decode(s.key, None, headers)
                out.append((s.partition, self.append(s.partition, s.key, record), record))
        return out

    def compacted(self) -> list[tuple[int, int, BufferRecord]]:
        """What a reader of the fully compacted topic reads: ``(partition, offset, record)``
        of the surviving records, partition by partition, in offset order."""
        out: list[tuple[int, int, BufferRecord]] = []
        for partition, log in sorted(self.partitions.items()):
            last: dict[bytes, int] = {key: offset for offset, key, _ in log}
            out += [
                (partition, offset, record)
                for offset, key, record in log
                if not isinstance(record, Tombstone) and last[key] == offset
            ]
        return out
