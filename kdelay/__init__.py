"""kdelay: delayed and scheduled messages for Apache Kafka.

What every component shares: the control headers (:mod:`kdelay.headers`), the buffer-record
contract (:mod:`kdelay.buffer`), errors, logging and the CLI. The development stack is
``dev/`` in a checkout, not part of this package.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from kdelay.errors import (
    BufferFormatError,
    ConfigError,
    InfrastructureError,
    InvalidHeaderError,
    KdelayError,
)

try:
    __version__ = version("kdelay")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = [
    "BufferFormatError",
    "ConfigError",
    "InfrastructureError",
    "InvalidHeaderError",
    "KdelayError",
    "__version__",
]
