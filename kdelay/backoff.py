"""The one exponential backoff every supervisor uses (proxy, replica threads, ``kdelay up``).

``initial_s * 2**(n-1)`` before the n-th restart in a row, at most ``cap_s``; a component that
then stays up ``reset_after_s`` starts over (Kubernetes' CrashLoopBackOff does the same).

Pure and immutable; safe from any thread.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between restarts of a component that keeps failing."""

    initial_s: float = 1.0
    cap_s: float = 30.0
    #: A component that stayed up this long starts its back-off over.
    reset_after_s: float = 60.0

    def consecutive(self, before: int, ran_s: float) -> int:
        """Failures in a row after one more, by a component that ran ``ran_s`` seconds since
        it last started, with ``before`` in a row until then."""
        return before + 1 if ran_s < self.reset_after_s else 1

    def delay(self, consecutive: int) -> float:
        """The wait in seconds before the ``consecutive``-th restart in a row (1-based)."""
        # 2.0 ** 1024 raises OverflowError: a unit never given up on gets there after 1,024
        # failures in a row; 2 ** 1000 is far past any cap already.
        doublings = min(max(0, consecutive - 1), 1000)
        return float(min(self.cap_s, self.initial_s * 2.0**doublings))
