"""Bounded decompression of record batches: a small compressed batch must not expand without
limit in the proxy's memory (a "decompression bomb").

kafka-python and aiokafka decompress a batch's records in one call per codec, with no bound on
the output. The proxy decompresses here instead, for each of Kafka's four codecs, and stops as
soon as the output would pass ``limit`` bytes: at most ``limit`` + one chunk is ever held. The
records are then parsed from the decompressed bytes (proxy/wire/records.py), as an uncompressed
batch.

Pure functions; safe from any thread.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
from typing import Final

import lz4.frame
import snappy
import zstandard

from kdelay.errors import KdelayError

NONE: Final = 0
GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
CODEC_NAMES: Final = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

#: Output produced per step while streaming (gzip, lz4, zstd).
CHUNK: Final = 1 << 20
#: xerial's framing of snappy (Kafka's Java client writes it): magic, version, compatible version.
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = 16
_BLOCK_LEN = struct.Struct(">i")


class DecompressError(KdelayError):
    """The compressed data is corrupt or uses an unknown codec."""


class TooLargeError(DecompressError):
    """The data decompresses to more than the limit."""

    def __init__(self, codec: int, limit: int) -> None:
        super().__init__(
            f"{CODEC_NAMES.get(codec, codec)} record batch decompresses to more than "
            f"{limit} bytes (the proxy's max_decompressed_bytes)"
        )
        self.limit = limit


def decompress(codec: int, data: bytes | memoryview, limit: int) -> bytes:
    """``data`` decompressed with Kafka codec ``codec``; TooLargeError beyond ``limit`` bytes."""
    decoder = _DECODERS.get(codec)
    if decoder is None:
        raise DecompressError(f"unknown compression codec {codec}")
    try:
        out = decoder(data, limit)
    except DecompressError:
        raise
    except Exception as exc:  # noqa: BLE001 - each codec library raises its own error types
        raise DecompressError(f"corrupt {CODEC_NAMES[codec]} data: {exc!r}") from None
    if len(out) > limit:
        raise TooLargeError(codec, limit)
    return out


class _Sink:
    """Collects output chunks and raises as soon as their total passes the limit."""

    def __init__(self, codec: int, limit: int) -> None:
        self.codec = codec
        self.limit = limit
        self.size = 0
        self.parts: list[bytes] = []

    def room(self) -> int:
        """How much more output to ask for: one byte past the limit proves it is exceeded."""
        return min(CHUNK, self.limit - self.size + 1)

    def add(self, part: bytes) -> None:
        self.size += len(part)
        if self.size > self.limit:
            raise TooLargeError(self.codec, self.limit)
        self.parts.append(part)

    def join(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


def _gzip(data: bytes | memoryview, limit: int) -> bytes:
    sink = _Sink(GZIP, limit)
    pending = bytes(data)
    while pending:  # one member after another, as GzipFile reads them
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        sink.add(d.decompress(pending, sink.room()))
        while not d.eof:
            # Input left over (output was capped), or output zlib still holds back.
            more = d.decompress(d.unconsumed_tail, sink.room())
            if not more and not d.eof:
                raise DecompressError("truncated gzip data")
            sink.add(more)
        pending = d.unused_data
    return sink.join()


def _snappy_length(block: bytes) -> int:
    """The uncompressed length a raw snappy block announces (its leading varint)."""
    value = shift = 0
    for i, byte in enumerate(block[:5]):
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value
        shift += 7
        if i == 4:
            break
    raise DecompressError("snappy block has no valid length preamble")


def _snappy(raw: bytes | memoryview, limit: int) -> bytes:
    """Raw snappy, or xerial-framed blocks; each block's declared size is checked first (a block
    never decompresses to more than it declares)."""
    data = bytes(raw)
    if not data.startswith(_XERIAL_MAGIC):
        blocks = [data]
    else:
        blocks = []
        pos = _XERIAL_HEADER
        while pos < len(data):
            if pos + 4 > len(data):
                raise DecompressError("truncated xerial snappy block length")
            (size,) = _BLOCK_LEN.unpack_from(data, pos)
            pos += 4
            if size < 0 or pos + size > len(data):
                raise DecompressError("xerial snappy block overruns the batch")
            blocks.append(data[pos : pos + size])
            pos += size
    sink = _Sink(SNAPPY, limit)
    for block in blocks:
        if sink.size + _snappy_length(block) > limit:
            raise TooLargeError(SNAPPY, limit)
        sink.add(snappy.decompress(block))
    return sink.join()


def _lz4(data: bytes | memoryview, limit: int) -> bytes:
    sink = _Sink(LZ4, limit)
    pending = bytes(data)
    while pending:  # one frame after another
        d = lz4.frame.LZ4FrameDecompressor()
        sink.add(d.decompress(pending, max_length=sink.room()))
        while not d.eof:
            if d.needs_input:
                raise DecompressError("truncated lz4 frame")
            sink.add(d.decompress(b"", max_length=sink.room()))
        pending = d.unused_data or b""
    return sink.join()


_ZSTD_SKIPPABLE: Final = 0x184D2A50  # the 16 skippable-frame magics share these 28 bits
_ZSTD_RLE_BLOCK: Final = 1


def _zstd_frames_end(data: memoryview) -> bool:
    """Whether ``data`` is whole zstd frames, by their block headers (RFC 8878, section 3.1).

    zstandard's stream reader ends quietly, with what it decoded so far, when the input stops
    inside a frame; walking the frame and block headers (no decompression) tells a truncated
    batch from a complete one.
    """
    pos, end = 0, len(data)
    while pos < end:
        if end - pos < 8:
            return False
        if int.from_bytes(data[pos : pos + 4], "little") & ~0xF == _ZSTD_SKIPPABLE:
            pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "little")
            continue
        frame = data[pos:]
        has_checksum = zstandard.get_frame_parameters(frame).has_checksum
        pos += zstandard.frame_header_size(frame)
        last = False
        while not last:
            if end - pos < 3:
                return False
            header = int.from_bytes(data[pos : pos + 3], "little")
            last, kind, size = bool(header & 1), (header >> 1) & 3, header >> 3
            pos += 3 + (1 if kind == _ZSTD_RLE_BLOCK else size)
        pos += 4 if has_checksum else 0
    return pos == end


def _zstd(data: bytes | memoryview, limit: int) -> bytes:
    if not _zstd_frames_end(memoryview(data)):
        raise DecompressError("corrupt zstd data: the input ends inside a frame (truncated)")
    sink = _Sink(ZSTD, limit)
    source = io.BytesIO(data)
    dctx = zstandard.ZstdDecompressor()
    with dctx.stream_reader(source, read_across_frames=True) as reader:
        while True:
            part = reader.read(sink.room())
            if not part:
                break
            sink.add(part)
    return sink.join()


_DECODERS: Final[dict[int, Callable[[bytes | memoryview, int], bytes]]] = {
    NONE: lambda data, _limit: bytes(data),
    GZIP: _gzip,
    SNAPPY: _snappy,
    LZ4: _lz4,
    ZSTD: _zstd,
}
