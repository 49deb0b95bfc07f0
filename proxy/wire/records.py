"""Reading one partition's produced record batch (magic v2), from raw bytes to its records.

``read_batch`` frames the batch and reads its header with kafka-python (bounds-checked, once per
batch) and refuses what the proxy does not accept; ``uncompressed`` decompresses its records
within a bound (proxy/wire/decompress.py says why the parsers' own decompression is not used);
``read_records`` parses them. A batch refused at any step raises ``BatchError`` with the Kafka
error code for its partition, and nothing of it is written.

Parsing records in pure Python (kafka-python's ``DefaultRecordBatch``: varints, one object per
record) would be most of the proxy's CPU on the immediate path. aiokafka ships the same record
classes compiled with Cython (``aiokafka.record._crecords``; aiokafka's record module derives
from kafka-python's), and those parse the records here. ``C_PARSER`` says whether they loaded:
aiokafka silently falls back to its pure-Python classes when the extension is missing or
``AIOKAFKA_NO_EXTENSIONS`` is set, and a unit test pins that it did not.

The compiled parser trusts its input more than a server reading untrusted bytes may, so:

- the batch is framed and its header read by kafka-python, and the compiled class is only ever
  given a whole batch at least as long as a v2 header;
- its varint reads check only that a varint's first byte is in bounds (header keys and values
  not even that), so a crafted record can make it read a few bytes past the batch: it reads from
  a copy followed by ``_PADDING`` zero bytes, never from memory that is not the proxy's;
- it decompresses without any bound when iterated: it is only ever given uncompressed batches
  (``uncompressed`` decompresses within ``max_decompressed_bytes``).

Pure functions; safe from any thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Protocol

import kafka.errors as kerr
from aiokafka.record.default_records import DefaultRecordBatch
from kafka.record.default_records import DefaultRecordBatch as _HeaderReader
from kafka.record.memory_records import MemoryRecords

from kdelay.errors import KdelayError
from kdelay.proxy.wire.decompress import DecompressError, TooLargeError, decompress
from kdelay.proxy.wire.protocol import DECODE_ERRORS

#: The compiled batch class (its pure-Python fallback when the extension did not load).
BatchParser: Final[Any] = DefaultRecordBatch
#: Whether records are parsed by the compiled class.
C_PARSER: Final = BatchParser.__module__.startswith("aiokafka.record._crecords")

#: Size of the v2 batch header; its records follow.
HEADER_SIZE: Final[int] = _HeaderReader.HEADER_STRUCT.size
#: More than the compiled parser can read past a batch's end: two unchecked varints of at
#: most 10 bytes each (a header value's length, then the next header key's length).
_PADDING: Final = bytes(32)
_ATTRIBUTES_LOW_BYTE: Final = _HeaderReader.ATTRIBUTES_OFFSET + 1
_CODEC_MASK: Final = _HeaderReader.CODEC_MASK


class BatchError(KdelayError):
    """A partition's batch is refused as a whole (nothing of it is written).

    ``code`` is the Kafka error for the partition's response, ``records`` how many records the
    rejected-records metric counts, ``reason`` its label, ``record_errors`` the response's
    per-record errors (batch index, message): the record at ``index`` when one record is at
    fault.
    """

    def __init__(
        self,
        code: int,
        message: str,
        records: int = 0,
        *,
        index: int | None = None,
        reason: str = "invalid_batch",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.records = records
        self.reason = reason
        self.record_errors: tuple[tuple[int, str | None], ...] = (
            ((index, message),) if index is not None else ()
        )


class BatchHeader(Protocol):
    """What the proxy reads from a batch's header (kafka-python's ``DefaultRecordBatch``)."""

    @property
    def size_in_bytes(self) -> int: ...
    @property
    def last_offset_delta(self) -> int: ...
    @property
    def compression_type(self) -> int: ...
    @property
    def is_transactional(self) -> bool: ...
    @property
    def producer_id(self) -> int: ...
    @property
    def producer_epoch(self) -> int: ...
    @property
    def base_sequence(self) -> int: ...
    @property
    def last_sequence(self) -> int: ...


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


def read_batch(raw: bytes) -> BatchHeader:
    """The one v2 record batch of a partition (Kafka requires exactly one since Produce v3),
    framed, CRC-checked and not a control batch."""
    if not raw:
        raise BatchError(kerr.InvalidRecordError.errno, "no record batch for this partition")
    try:
        records = MemoryRecords(raw)
        batches = []
        while records.has_next():
            batches.append(records.next_batch())
    except DECODE_ERRORS as exc:
        raise BatchError(
            kerr.CorruptRecordError.errno, f"malformed record batch: {exc!r}"
        ) from None
    if len(batches) != 1:
        raise BatchError(
            kerr.InvalidRecordError.errno,
            f"a produce request must carry one record batch per partition, got {len(batches)}",
        )
    batch = batches[0]
    if batch.magic != 2:
        raise BatchError(
            kerr.UnsupportedForMessageFormatError.errno,
            f"record batch format v{batch.magic}; the proxy accepts v2 only",
        )
    if not batch.validate_crc():
        raise BatchError(kerr.CorruptRecordError.errno, "record batch CRC mismatch")
    if batch.is_control_batch:
        raise BatchError(kerr.InvalidRecordError.errno, "control batches are not accepted")
    header: BatchHeader = batch
    return header


def count(raw: bytes) -> int:
    """How many records the batch in ``raw`` says it holds (0 when it cannot be read)."""
    try:
        return read_batch(raw).last_offset_delta + 1
    except BatchError:
        return 0


def uncompressed(raw: bytes, batch: BatchHeader, limit: int) -> tuple[bytes | memoryview, ...]:
    """``batch`` (the first and only one in ``raw``, as ``read_batch`` returned it) with its
    records decompressed within ``limit`` bytes: the parts of an uncompressed batch, header
    first, for ``read_records``."""
    codec = batch.compression_type
    if codec == 0:
        return (memoryview(raw)[: batch.size_in_bytes],)
    try:
        records = decompress(codec, memoryview(raw)[HEADER_SIZE : batch.size_in_bytes], limit)
    except TooLargeError as exc:
        raise BatchError(
            kerr.RecordListTooLargeError.errno, str(exc), batch.last_offset_delta + 1
        ) from None
    except DecompressError as exc:
        raise BatchError(kerr.CorruptRecordError.errno, str(exc)) from None
    header = bytearray(raw[:HEADER_SIZE])
    header[_ATTRIBUTES_LOW_BYTE] &= ~_CODEC_MASK & 0xFF
    return (bytes(header), records)


def read_records(parts: tuple[bytes | memoryview, ...]) -> list[Record]:
    """Every record of the uncompressed batch ``uncompressed`` returned, parsed before any is
    routed: a corrupt record anywhere refuses the whole batch."""
    try:
        return list(parse(*parts))
    except Exception as exc:  # noqa: BLE001 - the parser raises several error types
        raise BatchError(
            kerr.CorruptRecordError.errno, f"cannot decode the record batch: {exc!r}"
        ) from None
