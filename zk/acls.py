"""Close a delay set's ZooKeeper tree that was created open (before ``zk_auth_username``).

A replica started with ZooKeeper credentials creates every znode with kdelay's one digest ACL
(``zk/security.py``). A root its replicas created earlier without credentials is still open
(``world:anyone``), and so is everything below it. At start the replica (and ``kdelay
reshard``) walks the tree under the delay set's root, top down, and per node:

- an ACL that grants ``world:anyone`` anything is replaced by kdelay's ACL (anyone may do so
  while the node is open: the open ACL includes ADMIN);
- an ACL that already grants kdelay's user every permission is kept as it is (an operator may
  have added a read-only monitoring user beside it);
- any other ACL (another user's, or one kdelay's user cannot read or change) stops the start
  with a :class:`CoordinationError` naming the node: kdelay does not take over a tree someone
  else closed.

Top down, so a node is closed before its children are listed: a replica still running without
credentials cannot add an open child below a closed parent meanwhile (it gets NoAuth). Parents
above the root (``/kdelay`` of ``/kdelay/default``) are shared by other delay sets and left
alone; those kdelay creates itself get its ACL like any other node.

Threads: called from the owner's thread before the session is used; kazoo's client is
thread-safe.
"""

from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.security import ACL, Permissions

from kdelay import logs
from kdelay.zk.errors import CoordinationError, zk_errors

log = logs.get(__name__)


def _open(acl: ACL) -> bool:
    return bool(acl.id.scheme == "world" and acl.id.id == "anyone")


def close_tree(client: KazooClient, root: str, acl: list[ACL]) -> int:
    """Give every node under ``root`` (itself included) ``acl`` where the node is open (see
    the module docstring); how many nodes it changed. A missing root is not an error: the
    first replica creates it closed."""
    changed = 0
    pending = [root]
    try:
        while pending:
            path = pending.pop()
            try:
                closed, children = _close_node(client, path, acl)
            except NoNodeError:
                continue  # gone meanwhile (an ephemeral node of a stopped replica)
            except NoAuthError:
                raise CoordinationError(_refused(path, "is closed to")) from None
            changed += closed
            pending.extend(f"{path}/{child}" for child in sorted(children, reverse=True))
    except zk_errors() as exc:
        raise CoordinationError(f"cannot close the ZooKeeper tree under {root}: {exc!r}") from None
    if changed:
        log.info("zk.tree_closed", root=root, nodes=changed, acl=_describe(acl[0]))
    return changed


def _close_node(client: KazooClient, path: str, acl: list[ACL]) -> tuple[int, list[str]]:
    """Close one node if it is open: (1 if changed else 0, its children); kazoo errors
    propagate."""
    current, stat = client.get_acls(path)
    changed = 0
    if any(_open(entry) for entry in current):
        # Conditional on the ACL's version: one changed meanwhile is looked at again (restart).
        client.set_acls(path, acl, version=stat.aversion)
        changed = 1
    elif not any(entry.id == acl[0].id and entry.perms == Permissions.ALL for entry in current):
        raise CoordinationError(_refused(path, "does not give all permissions to"))
    return changed, list(client.get_children(path))


def _describe(acl: ACL) -> str:
    """``digest:user:hash`` without the hash (the hash can be attacked offline)."""
    user = acl.id.id.split(":", 1)[0]
    return f"{acl.id.scheme}:{user}"


def _refused(path: str, why: str) -> str:
    return (
        f"ZooKeeper node {path} {why} kdelay's ZooKeeper user (zk_auth_username): kdelay will "
        "not take over a tree closed by someone else; give that user all permissions on it "
        "(setAcl -R as ZooKeeper's super user), or choose another zk_root"
    )
