"""The local Kafka launcher's pure parts."""

from __future__ import annotations

import uuid

import pytest

from kdelay.local import kafka


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 encodes to '-' first in URL-safe base64; the format tool would read it as a flag.
    ids = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" + bytes(15))])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(ids))
    cid = kafka._cluster_id()
    assert cid == "AQAAAAAAAAAAAAAAAAAAAA"
