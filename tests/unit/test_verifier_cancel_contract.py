"""The verifier's cancel rule, written from the contract (verifier/cancel_contract.py), not
imported from the replicas' (``kdelay.buffer.cancel_rule``).

The history of the bug as it was reported (``PUT /v1/messages/{id}`` with ``"repeat":
"R5/PT1S"`` over a pending message delivered occurrence 1 and nothing more): the buffer held
the pending message, the replace, occurrence 1's tombstone and occurrence 2, written with
occurrence 1's acceptance stamp and cancelled on arrival by the replace's own cancel part.
Judged by the replicas' rule, occurrence 2 was "cancelled" and the verifier reported nothing;
judged by the contract it is missing."""

from __future__ import annotations

import ast
from pathlib import Path

from kdelay import buffer
from kdelay.verifier import cancel_contract as contract
from kdelay.verifier.report import Outcome, summarise
from kdelay.verifier.stream import CancelAt, CancelRegistry, ScheduleAt

ROOT = Path(__file__).resolve().parents[2]
T = 1_800_000_000_000
WITH = contract.SENT_WITH_MS
WINDOW = contract.WINDOW_MS


def message(offset: int, appended: int, accepted: int | None, key: str = "m") -> contract.MessageAt:
    return contract.MessageAt("x", 0, offset, appended, accepted, key)


def test_a_cancel_cancels_what_was_appended_before_it_and_what_was_sent_with_it() -> None:
    cancel = contract.CancelAt("x", 0, 10, T)
    assert contract.cancels(cancel, message(9, T - 1, T - 1))  # before it
    assert not contract.cancels(cancel, message(10, T, T))  # itself
    assert contract.cancels(cancel, message(11, T + 1, T + WITH))  # sent with it
    assert not contract.cancels(cancel, message(11, T + 1, T + WITH + 1))  # a new message
    assert not contract.cancels(cancel, message(11, T + WINDOW + 1, T))  # beyond the window
    assert not contract.cancels(cancel, message(11, T + 1, None))  # no proxy's stamp
    assert not contract.cancels(contract.CancelAt("x", 0, 10, None), message(11, T + 1, T))
    assert not contract.cancels(cancel, contract.MessageAt("x", 1, 9, T, T))  # other partition
    assert not contract.cancels(cancel, contract.MessageAt("y", 0, 9, T, T))  # other id


def test_a_replace_never_cancels_its_own_series_and_a_later_cancel_does() -> None:
    replace = contract.CancelAt("x", 0, 10, T, replace_key="r1")
    second = message(12, T + 1_000, T, key="r1#2")  # occurrence 1's stamp, inside the 100 ms
    assert not contract.cancels(replace, second)
    assert not contract.cancels(replace, message(10, T, T, key="r1"))  # the replacement
    assert contract.cancels(replace, message(9, T - 5, T - 5, key="old"))  # what it replaced
    assert contract.cancels(replace, message(11, T + 1, T + 1, key="s1"))  # sent with it
    assert contract.cancels(replace, message(13, T + 2_000, T - 1, key="r0#3"))  # older series
    later = contract.CancelAt("x", 0, 20, T + 1_500)  # a plain cancel after the replace
    assert contract.cancels(later, second)  # pending when it came
    assert contract.cancels(later, message(21, T + 1_600, T, key="r1#3"))  # written with it
    other = contract.CancelAt("x", 0, 20, T + 1_500, replace_key="r2")  # a later replace
    assert contract.cancels(other, message(21, T + 1_600, T, key="r1#3"))


def test_one_producers_sequence_decides_within_the_window() -> None:
    """docs/cancelling.md: the cancel cancels what the producer sent before it, whichever
    reaches the buffer first (appended at most 5 minutes after it), never what it sent after."""

    def stamp(sequence: int, producer: int = 7) -> str:
        return buffer.producer_seq(producer, 0, "orders", 3, sequence)

    cancel = contract.CancelAt("x", 0, 10, T, stamp=stamp(100))

    def msg(offset: int, appended: int, sequence: int, producer: int = 7) -> contract.MessageAt:
        return contract.MessageAt(
            "x", 0, offset, appended, appended, "m", stamp(sequence, producer)
        )

    assert not contract.cancels(cancel, msg(9, T - 1, 101))  # sent after it, appended before
    assert contract.cancels(cancel, msg(11, T + 60_000, 99))  # sent before, appended after
    assert contract.cancels(cancel, msg(11, T + WINDOW, 99))  # at the window's edge
    assert not contract.cancels(cancel, msg(11, T + WINDOW + 1, 99))  # beyond it
    assert not contract.cancels(cancel, msg(11, T + 1, 100))  # the same sequence
    assert not contract.cancels(cancel, msg(11, T + 60_000, 99, producer=8))  # rule 2 decides
    assert contract.cancels(cancel, msg(9, T - 1, 101, producer=8))  # rule 1 decides
    unstamped = contract.CancelAt("x", 0, 10, T)
    assert contract.cancels(unstamped, msg(9, T - 1, 101))  # rule 1 decides
    replace = contract.CancelAt("x", 0, 10, T, replace_key="m", stamp=stamp(100))
    assert not contract.cancels(replace, msg(9, T - 1, 99))  # never its own series


def test_sequence_order_is_wrap_aware_as_the_replicas_read_it() -> None:
    half, top = contract.SEQUENCE_MODULUS // 2, contract.SEQUENCE_MODULUS
    values = [0, 1, 2, 5, half - 1, half, half + 1, half + 5, top - 2, top - 1]
    for c in values:
        for m in values:
            for producer in (7, 8):
                c_q = buffer.producer_seq(7, 0, "orders", 3, c)
                m_q = buffer.producer_seq(producer, 0, "orders", 3, m)
                ours = contract.produced_before(c_q, m_q)
                assert ours == buffer.produced_before(c_q, m_q), (c, m, producer)
    assert contract.sequence_before(top - 2, 5)
    assert not contract.sequence_before(5, half + 5)  # exactly half ahead: not before
    assert contract.produced_before("7/0/3/5/orders", "7/1/3/4/orders") is None  # new epoch
    assert contract.produced_before(None, "7/0/3/4/orders") is None


# The reported history, one buffer partition: (offset, append time) of each record.
OLD: ScheduleAt = (
    "x",
    0,
    0,
    T - 5_000,
    T - 5_000,
    "t",
    "old",
    None,
)  # the pending message, replaced
REPLACE_AS_CANCEL: CancelAt = ("x", 0, 1, T, "r1", None)  # the PUT, accepted and appended at T
FIRST: ScheduleAt = ("x", 0, 1, T, T, "t", "r1", None)  # its occurrence 1, delivered
SECOND: ScheduleAt = (
    "x",
    0,
    3,
    T + 1_002,
    T,
    "t",
    "r1",
    None,
)  # written at its release, never delivered


def _outcomes(cancelled: set[tuple[str, int, int]]) -> list[Outcome]:
    """Per message (id, due) as the verifier sees it: occurrence 1 delivered at its due time
    (T + 1000), occurrence 2 (due T + 2000) never; the replaced message never."""
    due = {OLD[2]: T + 25_000, FIRST[2]: T + 1_000, SECOND[2]: T + 2_000}
    delivered = {FIRST[2]: (T + 1_001,)}
    return [
        Outcome("x", due[off], delivered.get(off, ()), cancelled=("x", 0, off) in cancelled)
        for off in (OLD[2], FIRST[2], SECOND[2])
    ]


def test_the_verifier_reports_the_replaced_series_lost_occurrence_as_missing() -> None:
    registry = CancelRegistry()
    registry.add([REPLACE_AS_CANCEL])
    cancelled = set(registry.cancelled([OLD, FIRST, SECOND]))
    assert cancelled == {("x", 0, 0)}  # the replaced message only
    report = summarise(_outcomes(cancelled), end_ms=T + 60_000, grace_ms=5_000)
    assert (report.delivered, report.missing, report.cancelled) == (1, 1, 1)


def test_the_replicas_rule_it_used_to_share_excused_the_lost_occurrence() -> None:
    """Why the verifier saw nothing: by the rule the replicas applied, the replace cancels
    occurrence 2 (appended after it, stamped within 100 ms of its append)."""
    _, c_part, c_off, c_ms, _, _ = REPLACE_AS_CANCEL
    excused = {
        ("x", c_part, off)
        for _, _, off, ts, acc, _, _, _ in (OLD, FIRST, SECOND)
        if buffer.cancels(c_off, c_ms, off, ts, acc)
    }
    assert excused == {("x", 0, 0), ("x", 0, 3)}
    report = summarise(_outcomes(excused), end_ms=T + 60_000, grace_ms=5_000)
    assert (report.missing, report.cancelled) == (0, 2)


def test_no_verifier_module_uses_the_replicas_cancel_rule() -> None:
    """import-linter forbids importing ``kdelay.buffer.cancel_rule``; this also catches a name
    of it taken through the ``kdelay.buffer`` package."""
    rule = ast.parse((ROOT / "kdelay/buffer/cancel_rule.py").read_text())
    names: set[str] = set()
    for stmt in rule.body:
        if isinstance(stmt, ast.FunctionDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    assert {"cancels", "CANCEL_SENT_WITH_MS", "own_series"} <= names
    used: list[tuple[str, str]] = []
    for path in sorted((ROOT / "verifier").glob("*.py")):
        tree = ast.parse(path.read_text())
        aliases: set[str] = set()  # names bound to the kdelay.buffer package in this module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kdelay.buffer"):
                used += [(path.name, a.name) for a in node.names if a.name in names]
            if isinstance(node, ast.ImportFrom) and node.module == "kdelay":
                aliases |= {a.asname or a.name for a in node.names if a.name == "buffer"}
            if isinstance(node, ast.Import):
                aliases |= {a.asname or a.name for a in node.names if a.name == "kdelay.buffer"}
        used += [
            (path.name, attr.attr)
            for attr in ast.walk(tree)
            if isinstance(attr, ast.Attribute)
            and isinstance(attr.value, ast.Name)
            and attr.value.id in aliases
            and attr.attr in names
        ]
    assert used == []
