"""ZooKeeper helpers for tests, after kazoo's own test harness."""

from __future__ import annotations

import threading

from kazoo.client import KazooClient, KazooState


def expire_session(client: KazooClient, timeout: float = 30.0) -> None:
    """Expire ``client``'s session on the server, the way kazoo's harness does it.

    A second client joins the same session (id and password) and closes it, which ends the
    session for the first client too; we wait until the first client sees LOST.
    """
    lost = threading.Event()

    def watch(state: str) -> bool:
        if state == KazooState.LOST:
            lost.set()
            return True
        return False

    client.add_listener(watch)
    session_id, password = client.client_id
    hosts = ",".join(f"{host}:{port}" for host, port in client.hosts)
    intruder = KazooClient(hosts=hosts, client_id=(session_id, password))
    intruder.start(timeout=timeout)
    intruder.stop()
    intruder.close()
    if not lost.wait(timeout):
        raise TimeoutError(f"session 0x{session_id:x} was not reported LOST within {timeout} s")
