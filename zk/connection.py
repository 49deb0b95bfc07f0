"""The ZooKeeper session and its connection states, handed off to the owner's thread.

kazoo calls state listeners in its connection thread, where blocking (or calling ZooKeeper)
would deadlock the client; :class:`Session` only records the state and queues it. The owner
drains :meth:`Session.changes` from its own thread and reacts: SUSPENDED -> pause forwarding,
LOST -> step down (the ephemeral nodes are gone), CONNECTED -> resume or rejoin.
"""

from __future__ import annotations

import queue
import threading

from kazoo.client import KazooClient, KazooState

from zk.errors import CoordinationError, zk_errors

CONNECTED = "connected"
SUSPENDED = "suspended"
LOST = "lost"
_STATES = {KazooState.CONNECTED: CONNECTED, KazooState.SUSPENDED: SUSPENDED, KazooState.LOST: LOST}


class Session:
    """A started KazooClient plus a queue of its state changes."""

    def __init__(self, hosts: str, timeout_s: float) -> None:
        self.client = KazooClient(hosts=hosts, timeout=timeout_s)
        self._queue: queue.Queue[str] = queue.Queue()
        self._state = LOST
        self._lock = threading.Lock()
        self.wakeup: threading.Event | None = None
        self.client.add_listener(self._listener)

    def _listener(self, state: str) -> bool:
        name = _STATES.get(state, LOST)
        with self._lock:
            self._state = name
        self._queue.put(name)
        if self.wakeup is not None:
            self.wakeup.set()
        return False  # keep listening

    @property
    def state(self) -> str:
        with self._lock:
            return self._state

    def start(self, timeout: float) -> None:
        try:
            self.client.start(timeout=timeout)
        except zk_errors() as exc:
            raise CoordinationError(f"ZooKeeper unreachable: {exc!r}") from None
        with self._lock:
            self._state = CONNECTED

    def changes(self) -> list[str]:
        """State changes since the last call, oldest first (never blocks)."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def session_id(self) -> tuple[int, bytes] | None:
        """The current session's id and password (for operators' and tests' fault drills)."""
        cid = self.client.client_id
        return None if cid is None else (int(cid[0]), bytes(cid[1]))

    def stop(self) -> None:
        try:
            self.client.stop()
            self.client.close()
        except zk_errors():
            pass
