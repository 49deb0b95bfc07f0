"""Errors of the delay service, under kdelay's one root."""

from __future__ import annotations

from kdelay.errors import KdelayError


class StoreError(KdelayError):
    """The RocksDB store is unusable or holds data this version cannot read."""
