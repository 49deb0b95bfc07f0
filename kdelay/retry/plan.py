"""What the retry helper (:mod:`kdelay.retry`) produces after a failed delivery: pure logic.

A delivery's *attempt* is 1 for a record read from one of the consumer's own topics, whatever
headers it carries (a record replayed from the dead-letter topic starts over), and the
``kdelay-attempt`` header's value for a record read from the retry topic (1 when absent or
malformed). When the handler fails on attempt ``n`` and the policy has a step left, the
message is produced again, through the proxy, to the retry topic with

- its key, value and the producer's own headers;
- ``kdelay-attempt: n + 1``, the attempt its next delivery will be;
- the policy's step ``n - 1`` as a timing header (``kdelay-delay-level`` or ``kdelay-delay-ms``);
- ``kdelay-original-topic`` / ``-partition`` / ``-offset``: where the first delivery was read,
  set on the first retry and kept on later ones;
- ``kdelay-error``: the handler's error on attempt ``n`` (type and message);
- ``kdelay-id``: ``retry-`` and a digest of (group, origin, next attempt). The replicas keep
  one copy of a record written twice per (id, buffer key), and the buffer key derives from the
  *producer's* identity, so a retry produced again by a restarted consumer is a second message
  either way; the stable id makes both copies one for ``kdelay cancel`` and the HTTP look-up.

Otherwise it goes to the dead-letter topic without timing headers (the proxy passes it through
at once) with ``kdelay-attempt: n`` (the attempts made), the original coordinates and
``kdelay-error``, but no id (the proxy refuses an id without a timing header). Headers the
delivered record carries and the proxy would interpret again are removed: ``kdelay-id`` and
``kdelay-deliver-at`` (the delivered due time would be read as the new one), every other control
header, ``kdelay-repeat``, ``kdelay-occurrence``, and names in kdelay's namespace that the proxy
would refuse. Functions of their arguments; safe from any thread.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from kdelay import headers as h
from kdelay.errors import ConfigError

#: The error header of a dead letter (the delay service's dead letters carry it too).
ERROR = "kdelay-error"
assert ERROR in h.DELIVERED_HEADERS
#: RocketMQ's RECONSUME_LATER schedule: delay levels 3..18 (10 s up to 2 h), 16 retries.
DEFAULT_LEVELS = tuple(range(3, 19))
#: A dead letter's error text is cut to this many UTF-8 bytes (the proxy allows 64 KiB).
MAX_ERROR_BYTES = 4096
ORIGIN_HEADERS = (h.ORIGINAL_TOPIC, h.ORIGINAL_PARTITION, h.ORIGINAL_OFFSET)
#: Headers never carried over: replaced by the helper, or read by the proxy as a request.
_DROPPED = h.CONTROL_HEADERS | {"kdelay-repeat", h.OCCURRENCE, h.ATTEMPT, ERROR, *ORIGIN_HEADERS}
_ID_NAMESPACE = uuid.UUID("6b64656c-6179-4b65-8b79-000000000014")

Header = tuple[str, bytes | None]


@dataclass(frozen=True, slots=True, init=False)
class RetryPolicy:
    """When to retry: RocketMQ delay levels (the proxy's level table) or delays in milliseconds,
    one per retry. ``RetryPolicy()`` is levels 3..18; ``RetryPolicy(delays_ms=[1000, 5000])``
    retries twice. ``max_attempts`` counts the first delivery: one more than the steps."""

    levels: tuple[int, ...] | None
    delays_ms: tuple[int, ...] | None

    def __init__(
        self, levels: Iterable[int] | None = None, delays_ms: Iterable[int] | None = None
    ) -> None:
        if levels is not None and delays_ms is not None:
            raise ConfigError("RetryPolicy: give levels or delays_ms, not both")
        lv = tuple(DEFAULT_LEVELS if levels is None and delays_ms is None else levels or ())
        ms = None if delays_ms is None else tuple(delays_ms)
        if ms is None and any(level < 1 for level in lv):
            raise ConfigError(f"RetryPolicy: levels must be 1 or more, got {list(lv)}")
        if ms is not None and any(d < 0 for d in ms):
            raise ConfigError(f"RetryPolicy: delays_ms must be 0 or more, got {list(ms)}")
        object.__setattr__(self, "levels", None if ms is not None else lv)
        object.__setattr__(self, "delays_ms", ms)

    @property
    def max_attempts(self) -> int:
        """Deliveries before a message is dead-lettered: the first one plus one per step."""
        return 1 + len(self.delays_ms if self.delays_ms is not None else self.levels or ())

    def timing(self, attempt: int) -> tuple[str, bytes]:
        """The timing header of the retry whose delivery will be attempt ``attempt`` (>= 2)."""
        if not 2 <= attempt <= self.max_attempts:
            raise ValueError(f"attempt {attempt} is not a retry of this policy")
        if self.delays_ms is not None:
            return h.DELAY_MS, str(self.delays_ms[attempt - 2]).encode()
        assert self.levels is not None
        return h.DELAY_LEVEL, str(self.levels[attempt - 2]).encode()


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a message was first delivered."""

    topic: str
    partition: int
    offset: int


class Kind(StrEnum):
    """What a failed delivery becomes (also the ``outcome`` label of the helper's metrics)."""

    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"


@dataclass(frozen=True, slots=True)
class Next:
    """The record to produce after a failed delivery (key and value are the message's own)."""

    kind: Kind
    topic: str
    headers: list[Header]
    #: The attempt the retry's delivery will be; for a dead letter, the attempts made.
    attempt: int
    origin: Origin


def _get(headers: Sequence[Header], name: str) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


def _int(raw: bytes | None) -> int | None:
    text = (raw or b"").decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def attempt_of(headers: Sequence[Header], *, from_retry_topic: bool) -> int:
    """The attempt this delivery is (see the module docstring)."""
    found = _int(_get(headers, h.ATTEMPT)) if from_retry_topic else None
    return found if found is not None and found >= 1 else 1


def origin_of(headers: Sequence[Header], here: Origin, *, from_retry_topic: bool) -> Origin:
    """Where the message was first delivered: its ``kdelay-original-*`` headers on the retry
    topic, else ``here`` (the coordinates of this delivery)."""
    if not from_retry_topic:
        return here
    topic = _get(headers, h.ORIGINAL_TOPIC)
    partition = _int(_get(headers, h.ORIGINAL_PARTITION))
    offset = _int(_get(headers, h.ORIGINAL_OFFSET))
    if not topic or partition is None or offset is None:
        return here
    return Origin(topic.decode("utf-8", "replace"), partition, offset)


def retry_id(group: str, origin: Origin, attempt: int) -> str:
    """The ``kdelay-id`` of the retry whose delivery will be ``attempt`` (38 characters)."""
    name = "\0".join((group, origin.topic, str(origin.partition), str(origin.offset), str(attempt)))
    return "retry-" + uuid.uuid5(_ID_NAMESPACE, name).hex


def carried(headers: Iterable[Header]) -> list[Header]:
    """The headers that go back with a retry or dead letter: the producer's own, and kdelay's
    delivered ones the helper does not replace (see the module docstring)."""
    return [
        (n, v)
        for n, v in headers
        if n not in _DROPPED and (n in h.DELIVERED_HEADERS or not h.in_namespace(n))
    ]


def error_text(exc: BaseException) -> bytes:
    """A dead letter's ``kdelay-error``: the exception's type and message, UTF-8, cut short."""
    raw = f"{type(exc).__qualname__}: {exc}".encode()
    return raw[:MAX_ERROR_BYTES].decode("utf-8", "ignore").encode()


def next_record(
    policy: RetryPolicy,
    *,
    group: str,
    retry_topic: str,
    dead_letter_topic: str,
    here: Origin,
    headers: Sequence[Header],
    error: BaseException,
) -> Next:
    """The retry or dead letter for a delivery at ``here`` with ``headers`` whose handler
    raised ``error``."""
    on_retry = here.topic == retry_topic
    attempt = attempt_of(headers, from_retry_topic=on_retry)
    origin = origin_of(headers, here, from_retry_topic=on_retry)
    own = [
        (h.ORIGINAL_TOPIC, origin.topic.encode()),
        (h.ORIGINAL_PARTITION, str(origin.partition).encode()),
        (h.ORIGINAL_OFFSET, str(origin.offset).encode()),
    ]
    base = carried(headers)
    if attempt < policy.max_attempts:
        nxt = attempt + 1
        timing = [policy.timing(nxt), (h.ID, retry_id(group, origin, nxt).encode())]
        out = [*base, (h.ATTEMPT, str(nxt).encode()), *own, (ERROR, error_text(error)), *timing]
        return Next(Kind.RETRIED, retry_topic, out, nxt, origin)
    out = [*base, (h.ATTEMPT, str(attempt).encode()), *own, (ERROR, error_text(error))]
    return Next(Kind.DEAD_LETTERED, dead_letter_topic, out, attempt, origin)
