"""The control headers of CONTRACT.md: how a producer asks for a delay, an id or a cancel.

Parsing is pure and shared by the proxy's Kafka listener and its HTTP API, so both reject the
same inputs with the same message. Values are ASCII; the id may be any 1-255 bytes of UTF-8.

kdelay owns every header name in its namespace (``kdelay`` in any case, alone or followed by
``-`` or ``_``). A name there that kdelay does not know is a mistake that would otherwise be
silent: ``KDELAY-DELAY-MS`` or ``kdelay_delay_ms`` is not ``kdelay-delay-ms``, so the record
would be delivered at once. ``classify`` rejects it, naming the closest valid header.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from difflib import get_close_matches

from kdelay import repeat
from kdelay.errors import InvalidHeaderError

DELAY_MS = "kdelay-delay-ms"
DELIVER_AT = "kdelay-deliver-at"
DELAY_LEVEL = "kdelay-delay-level"
ID = "kdelay-id"
CANCEL = "kdelay-cancel"
REPLACE = "kdelay-replace"
REPEAT = repeat.REPEAT
OCCURRENCE = "kdelay-occurrence"
#: The consumer retry helper's headers (``kdelay.retry``): the attempt number and where the
#: message was first consumed.
ATTEMPT = "kdelay-attempt"
ORIGINAL_TOPIC = "kdelay-original-topic"
ORIGINAL_PARTITION = "kdelay-original-partition"
ORIGINAL_OFFSET = "kdelay-original-offset"

#: Headers that choose when a record is delivered; at most one may be present.
TIMING_HEADERS = (DELAY_MS, DELIVER_AT, DELAY_LEVEL)
#: The timing headers as a set, for the one-header fast path of :func:`classify`.
_TIMING = frozenset(TIMING_HEADERS)
#: Headers the proxy consumes; they are not passed on with the delivered record.
CONTROL_HEADERS = frozenset({DELAY_MS, DELIVER_AT, DELAY_LEVEL, ID, CANCEL, REPEAT, REPLACE})
#: Names in kdelay's namespace kept for a feature this version does not implement: a record
#: carrying one is rejected, saying so, rather than delivered at once. (None at present.)
RESERVED_HEADERS: dict[str, str] = {}
#: Headers kdelay writes on the records it delivers or dead-letters (the delay service's
#: ``kdelay-error``, ``kdelay-source``, ``kdelay-target``, the buffer's ``kdelay-route``, a
#: repeat's ``kdelay-occurrence``) and those of the retry helper. A producer that replays such
#: a record sends them back; they are kdelay's own names, not mistakes, and pass through
#: untouched.
DELIVERED_HEADERS = frozenset(
    {
        "kdelay-error",
        "kdelay-source",
        "kdelay-target",
        "kdelay-route",
        OCCURRENCE,
        ATTEMPT,
        ORIGINAL_TOPIC,
        ORIGINAL_PARTITION,
        ORIGINAL_OFFSET,
    }
)
#: Every name in kdelay's namespace that is not a mistake.
KNOWN_HEADERS = CONTROL_HEADERS | DELIVERED_HEADERS | frozenset(RESERVED_HEADERS)
#: Header names the error for an unknown one may suggest (those a producer sends).
_SUGGESTED = sorted(CONTROL_HEADERS)
_NAMESPACE = "kdelay"

#: RocketMQ's default level table, in milliseconds: 1s 5s 10s 30s 1m 2m ... 10m 20m 30m 1h 2h.
DEFAULT_LEVELS_MS: tuple[int, ...] = tuple(
    s * 1000
    for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
)
DEFAULT_MAX_HORIZON_MS = 365 * 24 * 3600 * 1000
MAX_ID_BYTES = 255
#: 2001-01-01T00:00:00Z in epoch milliseconds. A numeric ``kdelay-deliver-at`` below it is
#: taken for epoch *seconds* (today's time in seconds, read as milliseconds, is in January
#: 1970), which would otherwise be "in the past: due now" and be delivered at once.
EARLIEST_DELIVER_AT_MS = 978_307_200_000
#: 10^14 ms is the year 5138: a numeric value from here up is microseconds or nanoseconds.
LATEST_DELIVER_AT_MS = 10**14
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_FRACTION = re.compile(r"[.,](\d+)")

Headers = Sequence[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class Delay:
    """A record that asks to be delivered at ``deliver_at_ms`` (epoch ms); ``delay_ms`` is set
    when it asked for a delay rather than a time (it then counts from the buffer record's
    append time, and ``deliver_at_ms`` is the estimate by the clock classify was given)."""

    deliver_at_ms: int
    id: str | None
    delay_ms: int | None = None
    repeat: str | None = None  # the canonical kdelay-repeat value (kdelay/repeat.py)
    #: ``kdelay-replace: true``: it replaces whatever is pending with its id (README
    #: "Replacing a message").
    replace: bool = False


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """A record that cancels the pending message ``id``; it is delivered nowhere."""

    id: str


@dataclass(frozen=True, slots=True)
class DelayPolicy:
    """The configurable part of header interpretation."""

    levels_ms: tuple[int, ...] = DEFAULT_LEVELS_MS
    max_horizon_ms: int = DEFAULT_MAX_HORIZON_MS


class UnknownHeaderError(InvalidHeaderError):
    """A header name in kdelay's namespace that is not one of kdelay's headers (a look-alike
    such as ``KDELAY-DELAY-MS``), or one reserved for a feature not supported yet."""


def in_namespace(name: str) -> bool:
    """Whether ``name`` is in kdelay's namespace: ``kdelay`` in any case, alone or followed by
    ``-`` or ``_`` (``kdelay-delay-ms``, ``KDELAY_ID``; not ``kdelayed`` or ``x-kdelay-id``)."""
    head = name[:7].lower()
    return head[:6] == _NAMESPACE and (len(head) == 6 or head[6] in "-_")


def unknown_header(name: str) -> UnknownHeaderError:
    """The error for ``name``, in kdelay's namespace but not one of :data:`KNOWN_HEADERS`:
    it names the closest valid header, or says the name is reserved for a later version."""
    normal = name.lower().replace("_", "-")
    if normal in RESERVED_HEADERS:
        spelled = "" if normal == name else f" (spelled {normal!r})"
        return UnknownHeaderError(
            name,
            f"is reserved for {RESERVED_HEADERS[normal]}{spelled}, which this version of "
            "kdelay does not support yet",
        )
    if normal in CONTROL_HEADERS:
        guess = [normal]
    else:  # compare what follows "kdelay-": every candidate shares the prefix
        suffix = normal[len(_NAMESPACE) + 1 :]
        close = get_close_matches(suffix, [n[len(_NAMESPACE) + 1 :] for n in _SUGGESTED], 1)
        guess = [f"{_NAMESPACE}-{close[0]}"] if close else []
    hint = (
        f"did you mean {guess[0]!r}? (names are lower-case, with '-')"
        if guess
        else f"kdelay's headers are {', '.join(_SUGGESTED)}"
    )
    return UnknownHeaderError(name, f"not a kdelay header; {hint}")


def new_id() -> str:
    """An id for a message that came without one: random, 32 hex characters."""
    return uuid.uuid4().hex


def _ascii(header: str, raw: bytes | None) -> str:
    if raw is None:
        raise InvalidHeaderError(header, "value is null")
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise InvalidHeaderError(header, "value is not ASCII") from None
    if not text:
        raise InvalidHeaderError(header, "value is empty")
    return text


def _int(header: str, raw: bytes | None) -> int:
    text = _ascii(header, raw)
    if not (text.isdigit() or (text.startswith("-") and text[1:].isdigit())):
        raise InvalidHeaderError(header, f"{text!r} is not an integer")
    return int(text)


def parse_deliver_at(header: str, raw: bytes | None) -> int:
    """Epoch milliseconds, or an RFC 3339 timestamp with an offset, to epoch milliseconds."""
    text = _ascii(header, raw)
    if text.isdigit():
        millis = int(text)
        if millis < EARLIEST_DELIVER_AT_MS:
            at = (_EPOCH + timedelta(milliseconds=millis)).isoformat(timespec="milliseconds")
            raise InvalidHeaderError(
                header,
                f"{text} read as epoch milliseconds is {at}, before 2001: it looks like epoch "
                f"seconds; send milliseconds ({millis * 1000}) or an RFC 3339 timestamp",
            )
        if millis >= LATEST_DELIVER_AT_MS:
            raise InvalidHeaderError(
                header,
                f"{text} read as epoch milliseconds is beyond the year 5000: it looks like "
                "epoch microseconds or nanoseconds; send milliseconds",
            )
        return millis
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidHeaderError(
            header, f"{text!r} is neither epoch milliseconds nor an RFC 3339 timestamp"
        ) from None
    if parsed.tzinfo is None:
        raise InvalidHeaderError(header, f"{text!r} has no UTC offset (RFC 3339 needs one)")
    micros = (parsed - _EPOCH) // timedelta(microseconds=1)
    millis = -(-micros // 1000)  # ceiled: a due time is never rounded earlier
    fraction = _FRACTION.search(text)
    if micros % 1000 == 0 and fraction is not None and fraction[1][6:].strip("0"):
        millis += 1  # digits beyond microseconds, which datetime dropped
    return millis


def validate_id(header: str, raw: bytes | None) -> str:
    """A message id: 1-255 bytes of UTF-8."""
    if raw is None or not raw:
        raise InvalidHeaderError(header, "id is empty")
    if len(raw) > MAX_ID_BYTES:
        raise InvalidHeaderError(header, f"id is {len(raw)} bytes, the maximum is {MAX_ID_BYTES}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidHeaderError(header, "id is not UTF-8") from None


def resolve_timing(
    header: str, raw: bytes | None, now_ms: int, policy: DelayPolicy
) -> tuple[int, int | None]:
    """The due time (epoch ms) asked for by one timing header, and the delay (ms) when it asks
    for a delay rather than a time."""
    delay: int | None = None
    if header == DELAY_MS:
        delay = _int(header, raw)
        if delay < 0:
            raise InvalidHeaderError(header, f"delay {delay} is negative")
        due = now_ms + delay
    elif header == DELIVER_AT:
        due = parse_deliver_at(header, raw)
    elif header == DELAY_LEVEL:
        level = _int(header, raw)
        if level < 1:
            raise InvalidHeaderError(header, f"level {level} is below 1")
        delay = policy.levels_ms[min(level, len(policy.levels_ms)) - 1]
        due = now_ms + delay
    else:  # pragma: no cover - callers pass TIMING_HEADERS only
        raise InvalidHeaderError(header, "not a timing header")
    if due - now_ms > policy.max_horizon_ms:
        raise InvalidHeaderError(
            header,
            f"due time is {(due - now_ms) // 1000} s ahead, beyond the maximum horizon "
            f"of {policy.max_horizon_ms // 1000} s",
        )
    return due, delay


def classify(headers: Headers, now_ms: int, policy: DelayPolicy) -> Delay | CancelRequest | None:
    """What a produced record asks for: a delay, a cancel, or nothing (pass through).

    Raises InvalidHeaderError naming the header when a control header is malformed, repeated,
    or combined with one it excludes, and UnknownHeaderError for a name in kdelay's namespace
    that is not one of kdelay's headers.
    """
    seen: dict[str, bytes | None] = {}
    for name, value in headers:
        if name in CONTROL_HEADERS:
            if name in seen:
                raise InvalidHeaderError(name, "header appears more than once")
            seen[name] = value
        elif name not in DELIVERED_HEADERS and in_namespace(name):
            raise unknown_header(name)
    if not seen:
        return None
    if len(seen) == 1:  # the common case: a delay or a due time alone
        ((name, raw),) = seen.items()
        if name in _TIMING:
            due, delay = resolve_timing(name, raw, now_ms, policy)
            return Delay(due, None, delay)
    timing = [h for h in TIMING_HEADERS if h in seen]
    replace = REPLACE in seen and _replace(seen)
    if CANCEL in seen:
        if timing or REPEAT in seen or REPLACE in seen:
            other = timing[0] if timing else REPEAT if REPEAT in seen else REPLACE
            raise InvalidHeaderError(CANCEL, f"cannot be combined with {other!r}")
        return CancelRequest(validate_id(CANCEL, seen[CANCEL]))
    msg_id = validate_id(ID, seen[ID]) if ID in seen else None
    if replace and msg_id is None:
        raise InvalidHeaderError(REPLACE, f"replaces the message with an id: {ID!r} is missing")
    found = _classify_delay(seen, timing, msg_id, now_ms, policy)
    return dataclasses.replace(found, replace=True) if replace else found


def _replace(seen: dict[str, bytes | None]) -> bool:
    """``kdelay-replace``'s value: ``true`` or ``false`` (ASCII, any case)."""
    text = _ascii(REPLACE, seen[REPLACE]).strip().lower()
    if text not in ("true", "false"):
        raise InvalidHeaderError(REPLACE, f"{text!r} is not true or false")
    return text == "true"


def _classify_delay(
    seen: dict[str, bytes | None],
    timing: list[str],
    msg_id: str | None,
    now_ms: int,
    policy: DelayPolicy,
) -> Delay:
    """The delay of a record that is no cancel (classify's second half)."""
    if len(timing) > 1:
        raise InvalidHeaderError(timing[1], f"only one of {', '.join(TIMING_HEADERS)} may be set")
    if REPEAT in seen:
        return _series(seen, msg_id, now_ms, policy)
    if not timing:
        raise InvalidHeaderError(ID, f"an id needs one of {', '.join(TIMING_HEADERS)}")
    due, delay = resolve_timing(timing[0], seen[timing[0]], now_ms, policy)
    return Delay(due, msg_id, delay)


def _series(
    seen: dict[str, bytes | None], msg_id: str | None, now_ms: int, policy: DelayPolicy
) -> Delay:
    """A recurring message (``kdelay-repeat``): the due time of its first occurrence."""
    rule = repeat.parse_repeat(_ascii(REPEAT, seen[REPEAT]), policy.max_horizon_ms)
    if rule.count is None and rule.end_ms is None and msg_id is None:
        raise InvalidHeaderError(
            REPEAT, f"a series without an end needs {ID!r}, so that it can be cancelled"
        )
    timing = [h for h in TIMING_HEADERS if h in seen]
    due, delay = (
        resolve_timing(timing[0], seen[timing[0]], now_ms, policy) if timing else (now_ms, 0)
    )
    if rule.cron is not None:  # occurrences are cron's matches: an absolute first due time
        due, delay = rule.first(due), None
        if due - now_ms > policy.max_horizon_ms:
            raise InvalidHeaderError(
                REPEAT,
                f"the first cron match is {(due - now_ms) // 1000} s ahead, beyond the "
                f"maximum horizon of {policy.max_horizon_ms // 1000} s",
            )
    return Delay(due, msg_id, delay, rule.text)


def strip_control(
    headers: Iterable[tuple[str, bytes | None]],
) -> tuple[tuple[str, bytes | None], ...]:
    """The producer's own headers with the control headers removed; a null value stays null
    (Kafka tells a null header value from an empty one, and so does the delivered record)."""
    return tuple((n, v) for n, v in headers if n not in CONTROL_HEADERS)
