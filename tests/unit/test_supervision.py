"""The one restart policy (kdelay/supervision.py): failures in a row, backoff, giving up and
starting over; and that it stays the only one in the product and the harness."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from kdelay.backoff import Backoff
from kdelay.supervision import Failure, RestartPolicy, Supervisor

ROOT = Path(__file__).resolve().parents[2]
#: The product's packages and the harness's (the components' folders: kdelay/ only links them).
SCANNED = ("kdelay", "proxy", "delay_service", "zk", "verifier", "dev", "bench")
HOME = "kdelay/supervision.py"


def test_each_failure_in_a_row_doubles_the_wait_up_to_the_cap() -> None:
    sup = Supervisor(RestartPolicy(Backoff(0.5, 4.0), max_failures=None))
    waits = [sup.failed("http").delay_s for _ in range(6)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert sup.consecutive("http") == 6
    assert sup.failed("kafka_listener") == Failure(1, 0.5, gave_up=False)  # counted apart


def test_a_unit_never_given_up_on_waits_the_cap_however_often_it_failed() -> None:
    sup = Supervisor(RestartPolicy(Backoff(1.0, 30.0), max_failures=None))
    waits = [sup.failed("replica-1").delay_s for _ in range(2000)]  # 2.0 ** 1024 overflows
    assert waits[-1] == 30.0


def test_the_max_failures_th_failure_in_a_row_gives_up() -> None:
    sup = Supervisor(RestartPolicy(Backoff(1.0, 30.0), max_failures=3))
    failures = [sup.failed("ingest") for _ in range(4)]
    assert [f.gave_up for f in failures] == [False, False, True, True]
    assert failures[2] == Failure(3, 4.0, gave_up=True)  # the wait still computed, for the log
    never = Supervisor(RestartPolicy(Backoff(), max_failures=None))
    assert not any(never.failed("replica-1").gave_up for _ in range(100))


def test_a_recovered_unit_starts_its_count_over() -> None:
    sup = Supervisor(RestartPolicy(Backoff(1.0, 30.0), max_failures=3))
    sup.failed("http")
    sup.failed("http")
    sup.recovered("http")
    assert sup.consecutive("http") == 0
    assert sup.failed("http") == Failure(1, 1.0, gave_up=False)


def test_a_long_enough_run_starts_the_count_over() -> None:
    sup = Supervisor(RestartPolicy(Backoff(1.0, 30.0, reset_after_s=60.0), max_failures=None))
    sup.failed("forwarder", ran_s=0.5)
    assert sup.failed("forwarder", ran_s=59.9).consecutive == 2
    assert sup.failed("forwarder", ran_s=60.0).consecutive == 1
    sup.failed("Kafka")
    sup.running("Kafka", 59.9)  # up, but not for long enough yet
    assert sup.consecutive("Kafka") == 1
    sup.running("Kafka", 60.0)
    assert sup.consecutive("Kafka") == 0
    # Without ran_s a failure always counts one more: only its owner says when it runs again.
    sup.failed("poll")
    assert sup.failed("poll").consecutive == 2


def test_failures_reported_from_many_threads_are_all_counted() -> None:
    sup = Supervisor(RestartPolicy(max_failures=None))

    def fail() -> None:
        for _ in range(1000):
            sup.failed("upstream_poll")

    threads = [threading.Thread(target=fail) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sup.consecutive("upstream_poll") == 8000


def restart_accounting(tree: ast.AST) -> list[str]:
    """Where ``tree`` defines a supervisor or restart policy of its own, or counts failures in
    a row itself (``Backoff.consecutive``, the rule kdelay/supervision.py applies)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name.endswith(("Supervisor", "RestartPolicy")):
            found.append(f"{node.lineno}: class {node.name}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "consecutive"
            and len(node.args) + len(node.keywords) == 2
        ):
            found.append(f"{node.lineno}: failures in a row counted by Backoff.consecutive")
    return found


def _modules(root: Path) -> dict[str, ast.AST]:
    found: dict[str, ast.AST] = {}
    for name in SCANNED:
        for path in sorted((root / name).rglob("*.py")):
            rel = path.relative_to(root)
            if not any(part.startswith((".", "__pycache__")) for part in rel.parts):
                found[rel.as_posix()] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return found


def offenders(root: Path) -> list[str]:
    """Every restart policy or failure count outside kdelay/supervision.py, and what that
    module lacks."""
    modules = _modules(root)
    wrong = [
        f"{path}:{where}"
        for path, tree in modules.items()
        if path != HOME
        for where in restart_accounting(tree)
    ]
    home = restart_accounting(modules[HOME]) if HOME in modules else []
    for name in ("Supervisor", "RestartPolicy"):
        if not any(where.endswith(f"class {name}") for where in home):
            wrong.append(f"{HOME}: no class {name}")
    return wrong


def test_there_is_one_supervisor_and_one_restart_policy() -> None:
    found = offenders(ROOT)
    assert found == [], (
        "restart accounting outside kdelay/supervision.py (use its Supervisor by composition):\n"
        + "\n".join(found)
    )


def test_the_scan_finds_a_supervisor_of_its_own_and_failures_counted_by_hand() -> None:
    tree = ast.parse(
        "class Supervisor:\n"
        "    pass\n"
        "class ProcessSupervisor:\n"
        "    pass\n"
        "class RestartPolicy:\n"
        "    pass\n"
        "worker.failures = self.backoff.consecutive(worker.failures, up_s)\n"
        "sup.consecutive('http')\n"
    )
    assert restart_accounting(tree) == [
        "1: class Supervisor",
        "3: class ProcessSupervisor",
        "5: class RestartPolicy",
        "7: failures in a row counted by Backoff.consecutive",
    ]
