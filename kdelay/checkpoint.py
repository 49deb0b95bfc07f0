"""The checkpoint of the delivery invariant (DESIGN.md): ``(T, O)``, its rule and its document.

A checkpoint ``(time_ms, offsets)`` means: *every buffer record of partition p with offset <
offsets[p] and deliver-at <= time_ms has been delivered.* :meth:`Checkpoint.covers` is that
rule, written here only: a replica drops the entries a checkpoint covers and skips them when it
reads the buffer topic again. ``time_ms == -1`` claims nothing delivered yet.

The master writes a :class:`CheckpointRecord` (the checkpoint, plus which replica wrote it under
which election epoch, and when) as one compact JSON document, which ZooKeeper keeps as opaque
fenced bytes (``zk/checkpoint.py``) and ``kdelay status`` shows as is::

    {"time_ms": T, "offsets": {"<partition>": O_p, ...}, "epoch": E, "writer": "<replica>",
     "written_at_ms": <wall clock ms>}

Values only: immutable and safe to share between threads.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdelay.errors import KdelayError

_TIME = struct.Struct(">q")
_PART = struct.Struct(">IQ")


class CheckpointFormatError(KdelayError):
    """Stored checkpoint bytes are not a checkpoint document."""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Every buffer record with offset < ``offsets[p]`` and deliver-at <= ``time_ms`` is done."""

    time_ms: int
    offsets: Mapping[int, int]

    def covers(self, partition: int, offset: int, deliver_at_ms: int) -> bool:
        """Whether the record at ``partition``/``offset`` due at ``deliver_at_ms`` was delivered."""
        return deliver_at_ms <= self.time_ms and offset < self.offsets.get(partition, 0)

    def to_bytes(self) -> bytes:
        """The binary form a replica's store keeps: ``time_ms`` (8, signed), then
        ``partition (4) | offset (8)`` per partition, all big-endian."""
        parts = [_TIME.pack(self.time_ms)]  # -1: "nothing delivered yet"
        parts += [_PART.pack(p, o) for p, o in sorted(self.offsets.items())]
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> Checkpoint:
        """Inverse of :meth:`to_bytes`."""
        (time_ms,) = _TIME.unpack_from(data, 0)
        offsets = {}
        for pos in range(_TIME.size, len(data), _PART.size):
            p, o = _PART.unpack_from(data, pos)
            offsets[int(p)] = int(o)
        return cls(int(time_ms), offsets)


#: The claim of a master that has delivered nothing yet.
NOTHING = Checkpoint(-1, {})


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """A checkpoint as the master wrote it: the claim, its election epoch, writer and time."""

    time_ms: int
    offsets: Mapping[int, int]
    epoch: int
    writer: str
    written_at_ms: int = 0

    @property
    def checkpoint(self) -> Checkpoint:
        """The claim itself."""
        return Checkpoint(self.time_ms, self.offsets)

    def to_json(self) -> dict[str, Any]:
        """The document's fields (offsets keyed by the partition as a string, sorted)."""
        return {
            "time_ms": self.time_ms,
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
            "epoch": self.epoch,
            "writer": self.writer,
            "written_at_ms": self.written_at_ms,
        }

    def encode(self) -> bytes:
        """The document as compact JSON bytes."""
        return json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> CheckpointRecord:
        """Inverse of :meth:`encode`; raises CheckpointFormatError on anything else."""
        try:
            obj = json.loads(data)
            return cls(
                time_ms=int(obj["time_ms"]),
                offsets={int(p): int(o) for p, o in obj["offsets"].items()},
                epoch=int(obj["epoch"]),
                writer=str(obj["writer"]),
                written_at_ms=int(obj.get("written_at_ms", 0)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointFormatError(f"no valid checkpoint document: {exc}") from None
