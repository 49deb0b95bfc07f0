"""kdelay.json_bytes.dumps writes exactly what orjson writes (the buffer format depends on it).

Why it copies (glibc's heap, see the module) is a matter of speed, measured by
``bench.proxy``, not asserted here."""

from __future__ import annotations

import orjson
import pytest

from kdelay.json_bytes import dumps


@pytest.mark.parametrize(
    "doc",
    [
        {"v": 2, "op": "s", "i": "b1." + "0" * 32, "t": "orders", "p": 3, "k": None, "s": 2**62},
        {"op": "d", "i": "é\u2603", "o": 0, "x": "delivered"},
        [],
        {"big": "x" * 5000},
    ],
)
def test_the_bytes_are_orjsons(doc: object) -> None:
    out = dumps(doc)
    assert type(out) is bytes
    assert out == orjson.dumps(doc)
