"""The proxy's Python work per routed record, counted so that code changes compare on a noisy
machine.

Run: ``.venv/bin/python -m bench.route_cpu`` (``--callgrind`` for instruction counts). No
sockets and no Kafka: ``proxy.routing.route.route`` (what the proxy does with each record of a
produce request, between parsing it and producing it upstream) on batches of 100 records of an
idempotent producer, 100 B values, a key and one header of the producer's own:

- ``kdelay``: delayed records, each with ``kdelay-delay-ms`` and its own ``kdelay-id`` (a
  message a producer may cancel): the control headers read, the id's buffer partition
  (Kafka's murmur2 of the id), the buffer key, the routing header;
- ``baseline``: the same records without kdelay's headers, which pass straight through: the
  least the proxy does with a record.

The ratio ``kdelay / baseline`` is what a delayed record costs the proxy against one that
passes through (``bench/harness/cpu_count.py``: CPU time, or instructions under valgrind).
"""

from __future__ import annotations

import uuid

from bench.harness import cpu_count
from kdelay import headers as h
from kdelay.headers import DelayPolicy
from kdelay.proxy.routing.buffer_keys import Origin
from kdelay.proxy.routing.route import route

_BATCH = 100
_NOW_MS = 1_800_000_000_000


class _Record:
    """A parsed record as the proxy sees one (aiokafka's ``DefaultRecord``'s attributes)."""

    __slots__ = ("headers", "key", "timestamp", "value")

    def __init__(self, key: bytes, headers: list[tuple[str, bytes | None]]) -> None:
        self.key: bytes | None = key
        self.value: bytes | None = b"v" * 100
        self.headers = headers
        self.timestamp: int | None = _NOW_MS


def batches(records: int, *, delayed: bool) -> list[list[_Record]]:
    out: list[_Record] = []
    for i in range(records):
        headers: list[tuple[str, bytes | None]] = [("trace", b"abc")]
        if delayed:
            headers += [(h.DELAY_MS, b"60000"), (h.ID, uuid.uuid4().hex.encode())]
        out.append(_Record(f"k{i}".encode(), headers))
    return [out[i : i + _BATCH] for i in range(0, len(out), _BATCH)]


def _route(groups: list[list[_Record]]) -> int:
    policy = DelayPolicy()
    routed = 0
    for n, batch in enumerate(groups):
        origin = Origin(producer_id=7, epoch=0, base_sequence=n * _BATCH)
        out, _ = route("orders", 3, batch, _NOW_MS, policy, buffer_partitions=12, origin=origin)
        routed += len(out)
    return routed


def child(mode: str, records: int) -> None:
    """One measurement in this process: print the measured part's CPU µs per record."""
    delayed, immediate = batches(records, delayed=True), batches(records, delayed=False)
    if mode != "setup":  # every mode builds both, so that the setup's count is theirs
        groups = immediate if mode == "baseline" else delayed
        cpu_count.report(lambda: _route(groups), records, mode)


def main(argv: list[str] | None = None) -> dict[str, float]:
    return cpu_count.main("bench.route_cpu", __doc__ or "", child, argv, what="routed records")


if __name__ == "__main__":
    main()
