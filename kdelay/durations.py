"""Durations as people type them, in milliseconds: one grammar for every flag and setting.

``1500`` (a bare number is milliseconds), ``500ms``, ``10s``, ``2m``, ``1h``, ``1d``; units in
any case, blanks around the number and the unit allowed. It is the union of what
``kdelay send --delay`` and the verifier's ``--window``/``--trigger`` accepted when each had
its own parser, so nothing that worked before is refused now.
"""

from __future__ import annotations

import re

#: Milliseconds per unit.
UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)


def duration_ms(text: str) -> int:
    """``text`` in milliseconds; ValueError naming ``text`` when it is not a duration."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 1500ms, 30s, 5m, 2h or 1d")
    return int(match.group(1)) * UNIT_MS[(match.group(2) or "ms").lower()]
