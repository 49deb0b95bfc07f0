"""Errors of the delay service, under kdelay's one root."""

from __future__ import annotations

from kdelay.errors import KdelayError


class StoreError(KdelayError):
    """The RocksDB store is unusable or holds data this version cannot read."""


class UnstorableError(KdelayError):
    """A message the store's entry format cannot hold (see ``entry.check_storable``)."""


class ComponentFailedError(KdelayError):
    """A supervised thread failed too often in a row: the process exits for a restart."""
