"""libfaketime for the clock-skew tests: a process whose wall clock is shifted, its monotonic
clock not (Debian's faketime, which ``make install`` installs)."""

from __future__ import annotations

import shutil


def faketime(offset: str) -> tuple[list[str], dict[str, str]]:
    """The command prefix and environment that shift only the wall clock by ``offset``."""
    found = shutil.which("faketime")
    assert found, "faketime is missing: apt-get install faketime (make install does it)"
    return [found, "-f", offset], {"FAKETIME_DONT_FAKE_MONOTONIC": "1"}
