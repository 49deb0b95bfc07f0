"""Leader election among caught-up replicas: ephemeral sequential candidates, lowest wins.

A replica calls :meth:`Election.join` only once it has caught up with the buffer topic. Each
candidate is an ephemeral sequential znode ``<root>/election/n_<seq>`` holding the replica's
name; the lowest sequence number leads. Leadership alone grants nothing: the winner must then
claim an epoch (:class:`zk.checkpoint.CheckpointStore`) whose number fences older masters.

Threads: kazoo runs the children watch in its event thread; ``on_change`` is called there with
the new leadership flag and must not block (set an event, put on a queue). ``join``/``leave``
(and ``rivals``: how many others stand, which a replica whose clock is off asks before it
stands or steps down) are called from the owner's control thread.

A candidate node outlives a failed delete: when ``leave`` cannot reach ZooKeeper, the session
may still come back (a server restart restores it, with its ephemeral nodes), and the old node,
lowest of all, would name this replica master while nobody forwards. So ``join`` first deletes
every candidate node its *own session* still owns (``ephemeralOwner``), and ``leave`` logs the
delete it could not confirm instead of passing over it; it waits at most ``LEAVE_WAIT_S`` for
it, so a step-down during an outage does not stall the control loop until ZooKeeper is back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat
from kazoo.recipe.watchers import ChildrenWatch

from kdelay import logs
from kdelay.zk.errors import CoordinationError, zk_errors
from kdelay.zk.paths import Paths

log = logs.get(__name__)

_PREFIX = "n_"
#: How long :meth:`Election.leave` waits for its delete before it moves on.
LEAVE_WAIT_S = 1.0
#: How long :meth:`Election.rivals` waits for each of its reads.
RIVALS_WAIT_S = 1.0


def _seq(child: str) -> int:
    return int(child.rsplit("_", 1)[1])


@dataclass(frozen=True)
class Candidate:
    """The leading candidate node: its name (``n_<seq>``), the replica it names, its stat."""

    node: str
    name: str
    stat: ZnodeStat


def leading_candidate(client: KazooClient, paths: Paths) -> Candidate | None:
    """The lowest candidate node, or None without candidates."""
    try:
        children = sorted(
            (c for c in client.get_children(paths.election) if c.startswith(_PREFIX)), key=_seq
        )
    except NoNodeError:
        return None
    for child in children:
        try:
            data, stat = client.get(f"{paths.election}/{child}")
        except NoNodeError:
            continue  # it just left; the next one leads
        return Candidate(child, str(data.decode()), stat)
    return None


def current_leader(client: KazooClient, paths: Paths) -> str | None:
    """The name held by the lowest candidate node, or None without candidates."""
    leading = leading_candidate(client, paths)
    return None if leading is None else leading.name


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
        """Create this replica's candidate node (again, after a lost session), first deleting
        any candidate node this session still owns (a ``leave`` that could not delete)."""
        try:
            self._client.ensure_path(self._paths.election)
            self._delete_own_nodes()
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

    def rivals(self) -> int:
        """How many candidate nodes stand now besides this replica's own: a fresh read (one
        request per candidate), for a replica deciding whether anyone else could lead. A node
        of its own session left by a ``leave`` that could not delete it does not count: it
        goes with the next ``join``. Raises CoordinationError when ZooKeeper does not answer
        within ``RIVALS_WAIT_S`` a read."""
        with self._lock:
            own = self._node
        client_id = self._client.client_id
        session = None if client_id is None else client_id[0]
        count = 0
        try:
            # Async with a bound, as in leave: a request queued while disconnected would hold
            # the caller's control loop until ZooKeeper is back.
            children = self._client.get_children_async(self._paths.election).get(
                timeout=RIVALS_WAIT_S
            )
            for child in children:
                if not child.startswith(_PREFIX) or child == own:
                    continue
                path = f"{self._paths.election}/{child}"
                stat = self._client.exists_async(path).get(timeout=RIVALS_WAIT_S)
                if stat is not None and stat.ephemeralOwner != session:
                    count += 1
        except NoNodeError:
            return 0  # nobody has ever stood in this replica set
        except zk_errors() as exc:
            raise CoordinationError(f"cannot read the election's candidates: {exc!r}") from None
        return count

    def _delete_own_nodes(self) -> None:
        """Delete the candidate nodes the current session owns (kazoo errors propagate)."""
        client_id = self._client.client_id
        if client_id is None:
            return
        session = client_id[0]
        for child in self._client.get_children(self._paths.election):
            path = f"{self._paths.election}/{child}"
            try:
                stat = self._client.exists(path)
                if stat is not None and stat.ephemeralOwner == session:
                    self._client.delete(path, version=stat.version)
                    log.info("election.stale_candidate_deleted", node=child, name=self._name)
            except NoNodeError:
                continue

    def leave(self) -> None:
        """Withdraw: delete the candidate node if the session still has it. If ZooKeeper cannot
        be reached, the node stays until the session ends or the next :meth:`join` deletes it."""
        with self._lock:
            node, self._node = self._node, None
            was, self._leader = self._leader, False
        if node is not None:
            try:
                # kazoo queues a request while disconnected: waiting on it would hold the
                # caller's control loop for a whole ZooKeeper outage. It still runs, in order,
                # on reconnection (before a later join's requests).
                request = self._client.delete_async(f"{self._paths.election}/{node}")
                request.get(timeout=LEAVE_WAIT_S)
            except NoNodeError:
                pass
            except zk_errors() as exc:
                log.warning(
                    "election.leave_incomplete",
                    node=node,
                    name=self._name,
                    error=repr(exc),
                    then="deleted by the next join, or gone with the session",
                )
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
