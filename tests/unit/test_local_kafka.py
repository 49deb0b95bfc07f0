"""The local Kafka launcher's pure parts."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from dev.stack import kafka


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # 0xF8 encodes to '-' first in URL-safe base64; the format tool would read it as a flag.
    ids = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=b"\x01" + bytes(15))])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(ids))
    cid = kafka.new_cluster_id()
    assert cid == "AQAAAAAAAAAAAAAAAAAAAA"


def test_the_cluster_id_is_attached_to_its_option(tmp_path: Path) -> None:
    # As a separate argument an id beginning with '-' is read as an option by kafka-storage.
    argv = kafka.format_argv("-AAAAAAAAAAAAAAAAAAAAA", tmp_path / "server.properties")
    assert "--cluster-id=-AAAAAAAAAAAAAAAAAAAAA" in argv
    assert "-AAAAAAAAAAAAAAAAAAAAA" not in argv
    assert argv[argv.index("--config") + 1] == str(tmp_path / "server.properties")
