"""The per-record limits the proxy enforces at the door (README "Limits", CONTRACT.md v2).

Every record that reaches ``routing.route`` (a produced batch's records and a posted HTTP
message alike) is checked here before it is classified, so both listeners reject the same
records with the same message, naming the limit's setting and its value. The limits apply to
every record, immediate or delayed: one rule is simpler to explain than two, and the defaults
sit at or above what upstream Kafka accepts by default, so ordinary traffic does not notice.

Why limits at all: a delayed record is stored by every delay-service replica and re-produced
when due; a record Kafka accepts (65,536 empty headers are only ~131 KB) can still be too much
for the tooling behind it. Rejecting it at the door costs the producer one error it can act on
instead of a replica that cannot ingest.

Pure and immutable; safe from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from kdelay.errors import KdelayError

#: Real producers send a handful of headers (tracing, schema ids, routing); a thousand leaves
#: two orders of magnitude of headroom while staying far below the 65,536 that broke ingest.
DEFAULT_MAX_HEADERS: Final = 1_000
#: Header names are identifiers (``traceparent``, ``content-type``).
DEFAULT_MAX_HEADER_NAME_BYTES: Final = 1_024
#: Header values carry tokens, baggage, schema ids: W3C baggage allows 8 KiB, JWTs a few KiB.
DEFAULT_MAX_HEADER_VALUE_BYTES: Final = 64 * 1024
#: Keys are identifiers for partitioning and compaction; Kafka sets no separate limit.
DEFAULT_MAX_KEY_BYTES: Final = 64 * 1024
#: Kafka's default max.message.bytes (1 MiB + 12) and librdkafka's message.max.bytes
#: (1,000,000, the proxy's upstream producer) already stop a larger record upstream.
DEFAULT_MAX_VALUE_BYTES: Final = 1024 * 1024

#: The ``reason`` label of a rejection by a limit is the limit's setting name.
LIMIT_SETTINGS: Final = (
    "max_headers",
    "max_header_name_bytes",
    "max_header_value_bytes",
    "max_key_bytes",
    "max_value_bytes",
)


@dataclass(frozen=True, slots=True)
class Violation:
    """One record over one limit: ``setting`` is the setting's name, ``limit`` its value,
    ``actual`` what the record had; ``field`` names the part of the record (for the HTTP API's
    error, which names a JSON field)."""

    setting: str
    limit: int
    actual: int
    field: str
    what: str

    @property
    def is_size(self) -> bool:
        """A size (bytes) limit, HTTP 413; otherwise a count, HTTP 422."""
        return self.setting.endswith("_bytes")

    def describe(self) -> str:
        """The problem, naming the limit and its value."""
        return f"{self.what} is {self.actual:,}, over the limit {self.setting}={self.limit:,}"


class LimitExceededError(KdelayError):
    """A record is over a limit (``violation``); routing turns it into a rejection."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation.describe())
        self.violation = violation


#: Header names are ``str`` (decoded UTF-8), at most 4 bytes per character.
_MAX_UTF8_PER_CHAR: Final = 4


@dataclass(frozen=True, slots=True)
class RecordLimits:
    """The limits of one proxy (from ProxyConfig); see the module docstring."""

    max_headers: int = DEFAULT_MAX_HEADERS
    max_header_name_bytes: int = DEFAULT_MAX_HEADER_NAME_BYTES
    max_header_value_bytes: int = DEFAULT_MAX_HEADER_VALUE_BYTES
    max_key_bytes: int = DEFAULT_MAX_KEY_BYTES
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES

    def check_body(self, key: bytes | None, value: bytes | None, headers: Sequence[object]) -> None:
        """Raise LimitExceededError when the key, the value or the header count is over."""
        if len(headers) > self.max_headers:
            raise LimitExceededError(
                Violation("max_headers", self.max_headers, len(headers), "headers", "header count")
            )
        if key is not None and len(key) > self.max_key_bytes:
            raise LimitExceededError(
                Violation("max_key_bytes", self.max_key_bytes, len(key), "key", "key size")
            )
        if value is not None and len(value) > self.max_value_bytes:
            raise LimitExceededError(
                Violation(
                    "max_value_bytes", self.max_value_bytes, len(value), "value", "value size"
                )
            )

    def scan_headers(self, headers: Sequence[tuple[str, bytes | None]], prefix: str) -> bool:
        """Whether any header name starts with ``prefix``; raises LimitExceededError for the
        first header whose name or value is over its limit. One pass: this runs per record on
        the immediate path, where it replaces the plain prefix scan."""
        name_limit = self.max_header_name_bytes
        # A name of at most this many characters cannot be over in bytes: skip encoding it.
        name_chars_ok = name_limit // _MAX_UTF8_PER_CHAR
        value_limit = self.max_header_value_bytes
        found = False
        for name, value in headers:
            if len(name) > name_chars_ok and len(name.encode()) > name_limit:
                raise LimitExceededError(
                    Violation(
                        "max_header_name_bytes",
                        name_limit,
                        len(name.encode()),
                        "headers",
                        f"header name {name[:40]!r}... size",
                    )
                )
            if value is not None and len(value) > value_limit:
                raise LimitExceededError(
                    Violation(
                        "max_header_value_bytes",
                        value_limit,
                        len(value),
                        f"headers.{name}",
                        f"value size of header {name[:100]!r}",
                    )
                )
            if not found and name.startswith(prefix):
                found = True
        return found
