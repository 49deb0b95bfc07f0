"""Find processes kdelay started whose owner is gone: the proof that nothing outlives its run.

Every supervised process carries ``kdelay.managed=<owner pid>`` in its command line
(dev/stack/process.py). One whose owner is no longer running is a leftover: it survived the
test run, ``kdelay up`` or benchmark that started it. Processes whose owner is alive belong to a
run still going on (another shell's ``kdelay up``), and are not reported.

``python -m dev.stack.leftovers`` prints the leftovers and exits 1 when there are any.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from dev.stack.process import MARKER

_OWNER = re.compile(re.escape(MARKER) + r"=(\d+)")


@dataclass(frozen=True)
class Managed:
    pid: int
    owner: int
    cmdline: str


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def managed(proc: Path = Path("/proc")) -> list[Managed]:
    """Every running process carrying the marker, with the owner it names."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        match = _OWNER.search(cmdline)
        if match and _alive(int(entry.name)):
            found.append(Managed(int(entry.name), int(match.group(1)), cmdline.strip()))
    return found


def orphans() -> list[Managed]:
    """Managed processes whose owner is no longer running."""
    return [m for m in managed() if not _alive(m.owner)]


def using(path: Path, found: list[Managed]) -> list[Managed]:
    """Those of ``found`` whose command line names ``path`` or a path under it (a replica's
    ``--data-dir``, Kafka's or ZooKeeper's config file)."""
    prefix = str(path.resolve())
    return [m for m in found if re.search(re.escape(prefix) + r"(?:/|\s|$)", m.cmdline)]


def describe(found: list[Managed], limit: int = 120) -> str:
    """One line per process: pid, the owner that is gone, the start of its command line."""
    return "\n".join(f"  {m.pid} (owner {m.owner} gone): {m.cmdline[:limit]}" for m in found)


def main() -> int:
    left = orphans()
    for m in left:
        print(f"{m.pid} (owner {m.owner} gone): {m.cmdline[:200]}")  # noqa: T201
    if left:
        print("FAIL: processes started by kdelay outlived their owner", file=sys.stderr)  # noqa: T201
        return 1
    print("no kdelay-managed process outlived its owner")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
