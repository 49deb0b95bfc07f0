"""kdelay.partitioner: librdkafka's murmur2 partitioner, called in place, against kafka-python's
pure-Python murmur2 and the Java client's own test vectors."""

from __future__ import annotations

import random

import pytest

from kdelay import partitioner
from kdelay.buffer import partition_for

#: org.apache.kafka.common.utils.UtilsTest#testMurmur2: Utils.murmur2 of each key (signed).
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}
COUNTS = (1, 2, 6, 12, 1000, 2**31 - 1)


def test_librdkafka_serves_on_this_install() -> None:
    # Without it every id the proxy routes costs 6.6 µs of pure Python instead of about 1:
    # fail loudly rather than fall back unnoticed.
    assert partitioner.NATIVE


@pytest.mark.parametrize("key", sorted(JAVA_MURMUR2))
def test_the_java_clients_partition_of_each_test_vector(key: bytes) -> None:
    for n in COUNTS:
        java = (JAVA_MURMUR2[key] & 0x7FFFFFFF) % n  # Utils.toPositive(murmur2(key)) % n
        assert partitioner.partition(key, n) == java
        assert partitioner.python_partition(key, n) == java


def test_librdkafka_and_python_agree_on_random_keys() -> None:
    rng = random.Random(13)
    for length in [*range(130), 1000, 10_000]:
        key = rng.randbytes(length)  # NUL bytes included: the length is passed, not a C string
        for n in COUNTS:
            assert partitioner.partition(key, n) == partitioner.python_partition(key, n)


@pytest.mark.parametrize("partitions", [0, -1, 2**31])
def test_a_partition_count_out_of_range_is_refused(partitions: int) -> None:
    with pytest.raises(ValueError, match="partitions must be 1 to 2147483647"):
        partitioner.partition(b"order-1", partitions)


def test_the_buffer_partition_of_an_id_is_the_partitioners() -> None:
    assert partition_for("order-1", 12) == partitioner.python_partition(b"order-1", 12)
    assert partition_for("b4." + "0" * 32, 6) == 4  # a pinned id names its partition
