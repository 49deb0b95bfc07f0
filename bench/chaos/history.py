"""The client-side history of a chaos run, and what was read back from the targets.

Plain data only: :mod:`bench.chaos.checker` judges it, so this module, like the checker,
imports nothing of kdelay, its components or the harness (the import-linter contract in
pyproject.toml). What each operation kind means is written here from CONTRACT.md's words.

An *id* is a message id the run chose (``kdelay-id``), or ``noid:<token>`` for a record sent
without one. Operations on one id are sequential (each sent after the previous one's answer),
so an id's history is a list in send order. Every write (a schedule, a replace, an immediate
record) carries a *token* of its own in the payload: a delivery names its write by the token,
whatever kdelay did to the headers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

#: Writes: a record that should be delivered (``due_lo`` .. ``due_hi``) unless superseded.
WRITES = frozenset(
    {
        "immediate",
        "delayed_noid",
        "delayed_header",
        "delayed_http",
        "series_header",
        "replace_header",
        "replace_http",
        "replace_series_http",
    }
)
#: Operations that cancel what was written before under the same id (a replace does both).
SUPERSEDES = frozenset(
    {
        "cancel_header",
        "cancel_http",
        "cancel_confirmed",
        "bulk_cancel",
        "bulk_cancel_confirmed",
        "replace_header",
        "replace_http",
        "replace_series_http",
    }
)
#: ``DELETE /v1/messages/{id}?wait=S``: a 200 promises the message is never delivered
#: (CONTRACT.md, v4 additions: "A confirmed cancel is final").
CONFIRMED = frozenset({"cancel_confirmed"})
#: Reads: recorded, not judged.
READS = frozenset({"status", "list"})
KINDS = WRITES | SUPERSEDES | READS


@dataclass
class Op:
    """One operation on one id. ``outcome``: ``ok`` (acknowledged, or HTTP 2xx), ``refused``
    (an HTTP answer that says it was not applied: 404, 409, 4xx), ``error`` (no answer, a
    delivery error, a 5xx: it may or may not have been applied), ``pending`` (never answered)."""

    kind: str
    msg_id: str
    sent_ms: int
    done_ms: int | None = None
    outcome: str = "pending"
    status: int | None = None
    answer: str = ""
    token: str | None = None
    topic: str | None = None
    #: The due time's bounds (epoch ms) of a write's first occurrence: a delay counts from the
    #: proxy's acceptance, which lies between the send and the acknowledgement.
    due_lo: int | None = None
    due_hi: int | None = None
    #: A series: how many occurrences, how far apart (``kdelay-repeat: R<count>/PT<period>``).
    repeat_count: int = 1
    period_ms: int = 0

    @property
    def acked(self) -> bool:
        return self.outcome == "ok"

    @property
    def confirmed(self) -> bool:
        """A confirmed cancel answered 200 ``cancelled``."""
        return self.kind in CONFIRMED and self.status == 200

    def occurrence_due(self, k: int) -> tuple[int, int]:
        """Occurrence ``k``'s (1-based) due-time bounds."""
        lo = self.sent_ms if self.due_lo is None else self.due_lo
        hi = lo if self.due_hi is None else self.due_hi  # never answered: not promised
        shift = (k - 1) * self.period_ms
        return lo + shift, hi + shift


@dataclass(frozen=True)
class Delivery:
    """One record read back (read_committed) from a target topic: the write's token from the
    payload, where it landed, its LogAppendTime and its ``kdelay-occurrence`` (None: absent)."""

    token: str
    topic: str
    partition: int
    offset: int
    ts_ms: int
    occurrence: int | None = None
    dead_letter: bool = False


@dataclass
class History:
    """Every id's operations in send order; thread-safety is the recorder's business."""

    ops: dict[str, list[Op]] = field(default_factory=dict)

    def add(self, op: Op) -> Op:
        self.ops.setdefault(op.msg_id, []).append(op)
        return op

    def writes(self) -> dict[str, Op]:
        """Token -> the write that carried it."""
        return {
            op.token: op
            for ops in self.ops.values()
            for op in ops
            if op.kind in WRITES and op.token is not None
        }

    def to_json(self) -> dict[str, Any]:
        return {msg_id: [asdict(op) for op in ops] for msg_id, ops in self.ops.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> History:
        return cls({msg_id: [Op(**op) for op in ops] for msg_id, ops in data.items()})
