"""Kafka's key partitioner: ``(murmur2(key) & 0x7fffffff) % partitions``, the Java client's
default, computed by librdkafka.

The buffer partition of every id the proxy routes (``kdelay.buffer.partition_for``) is this hash
of the id, on the proxy's hot path (docs/decisions/0009-hot-paths-native-where-a-library-is.md).
librdkafka, which confluent-kafka loads anyway, exports the same partitioner as public API
(``rd_kafka_msg_partitioner_murmur2``, rdkafka.h: it uses neither the topic nor the opaques),
so it is called in place through ctypes rather than kafka-python's pure-Python murmur2; the
numbers are the same (a unit test compares them with kafka-python's on random keys and with the
Java client's test vectors). ``NATIVE`` says whether it was found; without it
(a librdkafka this module cannot locate) kafka-python's pure-Python hash serves, with the
same results.

Pure: safe from any thread. The library is called without releasing the interpreter lock
(``ctypes.PyDLL``): the call is shorter than a lock hand-over.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import confluent_kafka

_INT32_MAX = 0x7FFFFFFF


def _loaded_librdkafka() -> Path | None:
    """The librdkafka this process loaded with confluent-kafka (its wheel's own copy, or a
    system one), from the process's memory map."""
    confluent_kafka.libversion()  # its C module, imported above, loaded the library
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:  # not Linux
        return None
    for line in maps.splitlines():
        path = line.split(maxsplit=5)[-1]
        if "librdkafka" in Path(path).name:
            return Path(path)
    return None


def _native() -> Callable[..., int] | None:
    """``rd_kafka_msg_partitioner_murmur2`` of the loaded librdkafka, typed, or None."""
    path = _loaded_librdkafka()
    if path is None:
        return None
    try:
        fn = ctypes.PyDLL(str(path)).rd_kafka_msg_partitioner_murmur2
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int32
    fn.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int32,
        ctypes.c_void_p, ctypes.c_void_p,
    ]  # fmt: skip
    return fn


_MURMUR2 = _native()
#: Whether librdkafka's partitioner serves (else kafka-python's pure-Python murmur2).
NATIVE = _MURMUR2 is not None


def python_partition(key: bytes, partitions: int) -> int:
    """:func:`partition` in pure Python (kafka-python's murmur2): the fallback, and the
    reference the tests compare the native one with. Imported here: kafka-python's package
    builds its protocol classes on import (0.1 s), which a replica never needs otherwise."""
    from kafka.partitioner.default import murmur2

    return (int(murmur2(key)) & _INT32_MAX) % partitions


def partition(key: bytes, partitions: int) -> int:
    """The partition of ``partitions`` that Kafka's default partitioner gives ``key``."""
    if not 0 < partitions <= _INT32_MAX:
        raise ValueError(f"partitions must be 1 to {_INT32_MAX}, not {partitions}")
    if _MURMUR2 is None:
        return python_partition(key, partitions)
    return _MURMUR2(None, key, len(key), partitions, None, None)
