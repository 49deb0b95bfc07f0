"""Leader election among caught-up replicas: ephemeral sequential candidates, lowest wins.

A replica calls :meth:`Election.join` only once it has caught up with the buffer topic. Each
candidate is an ephemeral sequential znode ``<root>/election/n_<seq>`` holding the replica's
name; the lowest sequence number leads. Leadership alone grants nothing: the winner must then
claim an epoch (:class:`zk.checkpoint.CheckpointStore`) whose number fences older masters.

Threads: kazoo runs the children watch in its event thread; ``on_change`` is called there with
the new leadership flag and must not block (set an event, put on a queue). ``join``/``leave``
are called from the owner's control thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.recipe.watchers import ChildrenWatch

from zk.errors import CoordinationError, zk_errors
from zk.paths import Paths

_PREFIX = "n_"


def _seq(child: str) -> int:
    return int(child.rsplit("_", 1)[1])


def current_leader(client: KazooClient, paths: Paths) -> str | None:
    """The name held by the lowest candidate node, or None without candidates."""
    try:
        children = sorted(
            (c for c in client.get_children(paths.election) if c.startswith(_PREFIX)), key=_seq
        )
    except NoNodeError:
        return None
    for child in children:
        try:
            data, _ = client.get(f"{paths.election}/{child}")
        except NoNodeError:
            continue  # it just left; the next one leads
        return str(data.decode())
    return None


class Election:
    """One replica's candidacy."""

    def __init__(
        self, client: KazooClient, paths: Paths, name: str, on_change: Callable[[bool], None]
    ) -> None:
        self._client = client
        self._paths = paths
        self._name = name
        self._on_change = on_change
        self._lock = threading.Lock()
        self._node: str | None = None
        self._leader = False
        self._watching = False

    @property
    def is_leader(self) -> bool:
        with self._lock:
            return self._leader

    @property
    def node(self) -> str | None:
        with self._lock:
            return self._node

    def join(self) -> None:
        """Create this replica's candidate node (again, after a lost session)."""
        try:
            self._client.ensure_path(self._paths.election)
            path = self._client.create(
                f"{self._paths.election}/{_PREFIX}",
                self._name.encode(),
                ephemeral=True,
                sequence=True,
            )
        except zk_errors() as exc:
            raise CoordinationError(f"cannot join the election: {exc!r}") from None
        with self._lock:
            self._node = path.rsplit("/", 1)[1]
        if not self._watching:
            self._watching = True
            ChildrenWatch(self._client, self._paths.election, self._children_changed)
        else:
            self._children_changed(self._client.get_children(self._paths.election))

    def leave(self) -> None:
        """Withdraw: delete the candidate node if the session still has it."""
        with self._lock:
            node, self._node = self._node, None
            was, self._leader = self._leader, False
        if node is not None:
            try:
                self._client.delete(f"{self._paths.election}/{node}")
            except NoNodeError:
                pass
            except zk_errors():
                pass  # the session is gone, and with it the ephemeral node
        if was:
            self._on_change(False)

    def forget(self) -> None:
        """The session was lost: the node is gone without a delete."""
        with self._lock:
            self._node = None
            was, self._leader = self._leader, False
        if was:
            self._on_change(False)

    def _children_changed(self, children: list[str]) -> bool:
        candidates = sorted((c for c in children if c.startswith(_PREFIX)), key=_seq)
        with self._lock:
            node = self._node
            leader = node is not None and bool(candidates) and candidates[0] == node
            changed = leader != self._leader
            self._leader = leader
        if changed:
            self._on_change(leader)
        return True  # keep watching
