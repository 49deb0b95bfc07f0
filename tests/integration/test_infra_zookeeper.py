"""ZooKeeper: an ephemeral node goes away when its session is expired."""

from __future__ import annotations

import uuid

from kazoo.client import KazooClient

from dev.stack import wait_until
from tests.support.infra import ZooKeeperInfra
from tests.support.zk_helpers import expire_session


def test_ephemeral_node_disappears_on_session_expiry(zookeeper: ZooKeeperInfra) -> None:
    path = f"/kdelay-test/{uuid.uuid4().hex}"
    owner = KazooClient(hosts=zookeeper.connect, timeout=4.0)
    observer = KazooClient(hosts=zookeeper.connect, timeout=4.0)
    owner.start(timeout=15)
    observer.start(timeout=15)
    try:
        owner.create(path, b"alive", ephemeral=True, makepath=True)
        assert observer.exists(path) is not None
        expire_session(owner)
        wait_until(lambda: observer.exists(path) is None, timeout=15, what=f"{path} to vanish")
    finally:
        owner.stop()
        owner.close()
        observer.stop()
        observer.close()
