"""What the components and the harness ask of a ZooKeeper client beyond the recipes of this
package: the client's type, whether a path may be listed, a path's children, a data watch,
a digest credential and a one-off session probe. They use kazoo only through here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeAlias

from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kazoo.recipe.watchers import DataWatch
from kazoo.security import make_digest_acl_credential

#: A ZooKeeper client (``Session.client``).
ZkClient: TypeAlias = KazooClient


def may_list(client: ZkClient, path: str) -> bool:
    """Whether ZooKeeper lets this session list ``path`` (a path not created yet: it does)."""
    try:
        client.get_children(path)
    except NoNodeError:
        return True
    except NoAuthError:
        return False
    return True


def children(client: ZkClient, path: str) -> list[str] | None:
    """The children of ``path``; None when it does not exist."""
    try:
        return list(client.get_children(path))
    except NoNodeError:
        return None


def watch_data(client: ZkClient, path: str, func: Callable[..., Any]) -> None:
    """Call ``func(data, stat)`` with ``path``'s data now and on every change (kazoo's
    DataWatch: on its own thread, so ``func`` must not block)."""
    DataWatch(client, path, func)


def digest_credential(user: str, password: str) -> str:
    """ZooKeeper's ``user:base64(sha1(user:password))``, as ``superDigest`` takes it."""
    return str(make_digest_acl_credential(user, password))


def session_ok(connect: str, *, timeout: float, logger: logging.Logger, **client_args: Any) -> bool:
    """Whether a ZooKeeper session opens at ``connect`` and can list ``/`` (``client_args``:
    more client arguments, e.g. TLS)."""
    client = KazooClient(hosts=connect, timeout=timeout, logger=logger, **client_args)
    try:
        client.start(timeout=timeout)
        client.get_children("/")
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False
    finally:
        client.stop()
        client.close()
    return True
