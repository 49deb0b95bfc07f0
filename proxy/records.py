"""Reading a produced record batch (magic v2): kafka-python frames it, aiokafka parses its records.

Parsing records in pure Python (kafka-python's ``DefaultRecordBatch``: varints, one object per
record) was about 45 % of the proxy's CPU on the immediate path. aiokafka ships the same record
classes compiled with Cython (``aiokafka.record._crecords``; aiokafka's record module derives
from kafka-python's), and those parse the records here. ``C_PARSER`` says whether they loaded:
aiokafka silently falls back to its pure-Python classes when the extension is missing or
``AIOKAFKA_NO_EXTENSIONS`` is set, and a unit test pins that it did not.

The compiled parser trusts its input more than a server reading untrusted bytes may, so:

- the batch is framed and its header read by kafka-python (bounds-checked, once per batch), and
  the compiled class is only ever given a whole batch at least as long as a v2 header;
- its varint reads check only that a varint's first byte is in bounds (header keys and values
  not even that), so a crafted record can make it read a few bytes past the batch: it reads from
  a copy followed by ``_PADDING`` zero bytes, never from memory that is not the proxy's;
- it decompresses without any bound when iterated: it is only ever given uncompressed batches
  (proxy/decompress.py decompresses within ``max_decompressed_bytes``).

Pure functions; safe from any thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Protocol

from aiokafka.record.default_records import DefaultRecordBatch
from kafka.record.default_records import DefaultRecordBatch as _HeaderReader

#: The compiled batch class (its pure-Python fallback when the extension did not load).
BatchParser: Final[Any] = DefaultRecordBatch
#: Whether records are parsed by the compiled class.
C_PARSER: Final = BatchParser.__module__.startswith("aiokafka.record._crecords")

#: Size of the v2 batch header; its records follow.
HEADER_SIZE: Final[int] = _HeaderReader.HEADER_STRUCT.size
#: More than the compiled parser can read past a batch's end: two unchecked varints of at
#: most 10 bytes each (a header value's length, then the next header key's length).
_PADDING: Final = bytes(32)


class Record(Protocol):
    """One parsed record (aiokafka's ``DefaultRecord``)."""

    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> list[tuple[str, bytes | None]]: ...
    @property
    def timestamp(self) -> int | None: ...


def parse(*parts: bytes | memoryview) -> Iterator[Record]:
    """The records of the uncompressed v2 batch made of ``parts`` joined (header, then records).

    The caller checked the batch's framing, CRC and codec (none). Raises aiokafka's
    ``CorruptRecordException`` (or ``UnicodeDecodeError`` for a header key) while iterating.
    """
    padded = b"".join((*parts, _PADDING))
    size = len(padded) - len(_PADDING)
    if size < HEADER_SIZE:
        raise ValueError(f"record batch of {size} bytes is shorter than its header")
    batch = BatchParser(memoryview(padded)[:size])
    records: Iterator[Record] = iter(batch)
    return records
