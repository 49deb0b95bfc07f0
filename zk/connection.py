"""The ZooKeeper session and its connection states, handed off to the owner's thread.

kazoo calls state listeners in its connection thread, where blocking (or calling ZooKeeper)
would deadlock the client; :class:`Session` only records the state and queues it. The owner
drains :meth:`Session.changes` from its own thread and reacts: SUSPENDED -> pause forwarding,
LOST -> step down (the ephemeral nodes are gone), CONNECTED -> resume or rejoin.

Reconnecting: kazoo's default connection retry doubles its wait without a useful bound (0.1 s,
0.2 s ... 12.8 s, 25.6 s), so after a 20 s ZooKeeper outage a client slept through most of the
session it could still have restored. :data:`RECONNECT` caps the wait at half a second (0.7 s
with jitter): a restarted server hears from every client within that, inside even a 2 s
session, and a dead server costs two refused TCP connects a second per client.

Security: ``security`` (``zk/security.py``) adds digest credentials, kdelay's ACL for every
znode created through this session, and TLS. With ``close_root`` too, :meth:`Session.start`
closes that tree if it was created open (``zk/acls.py``): the replicas and ``kdelay reshard``
pass their delay set's root, readers (``kdelay status``) pass none.
"""

from __future__ import annotations

import queue
import threading

from kazoo.client import KazooClient, KazooState

from kdelay.zk.acls import close_tree
from kdelay.zk.errors import CoordinationError, zk_errors
from kdelay.zk.security import ZkSecurity

CONNECTED = "connected"
SUSPENDED = "suspended"
LOST = "lost"
_STATES = {KazooState.CONNECTED: CONNECTED, KazooState.SUSPENDED: SUSPENDED, KazooState.LOST: LOST}


#: kazoo's connection retry: forever, from 0.1 s doubling to at most 0.5 s, +-40 % jitter (so
#: the replicas of a set do not reconnect in lockstep).
RECONNECT: dict[str, float] = {
    "max_tries": -1,
    "delay": 0.1,
    "backoff": 2,
    "max_delay": 0.5,
    "max_jitter": 0.4,
}


class Session:
    """A started KazooClient plus a queue of its state changes.

    ``timeout_s`` is the session timeout asked for; the server clamps it to its
    [minSessionTimeout, maxSessionTimeout] (by default 2 and 20 tickTimes). ``security``
    and ``close_root``: see the module docstring.
    """

    def __init__(
        self,
        hosts: str,
        timeout_s: float,
        *,
        security: ZkSecurity | None = None,
        close_root: str | None = None,
    ) -> None:
        self.client = KazooClient(
            hosts=hosts,
            timeout=timeout_s,
            connection_retry=dict(RECONNECT),
            **(security.kazoo_kwargs() if security is not None else {}),
        )
        self._acl = security.zk_acl() if security is not None else None
        self._close_root = close_root
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
        if self._acl is not None and self._close_root is not None:
            try:
                close_tree(self.client, self._close_root, self._acl)
            except CoordinationError:
                self.stop()
                raise

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
