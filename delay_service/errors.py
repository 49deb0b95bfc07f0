"""Errors of the delay service, under kdelay's one root."""

from __future__ import annotations

from typing import Any

from kdelay.errors import KdelayError


class StoreError(KdelayError):
    """The RocksDB store is unusable or holds data this version cannot read."""


class UnstorableError(KdelayError):
    """A message the store's entry format cannot hold (see ``entry.check_storable``)."""


class ComponentFailedError(KdelayError):
    """A supervised thread failed too often in a row: the process exits for a restart."""


class QueryError(KdelayError):
    """A question this replica cannot answer: ``status`` (400, 404, 503) and, for a bad
    parameter, the ``field`` at fault; the message names it."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.field = field

    def body(self) -> dict[str, Any]:
        """The one error shape of kdelay's HTTP APIs (proxy/http/errors.py)."""
        out: dict[str, Any] = {"error": str(self)}
        if self.field is not None:
            out["field"] = self.field
        return out
