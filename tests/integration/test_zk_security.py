"""ZooKeeper security on a real ZooKeeper with a digest super user and TLS:
replicas that log in elect a master and deliver; every znode they create carries only kdelay's
digest ACL, so an anonymous client and one with a wrong password get NoAuth on the election,
the registry, the layout and the checkpoint; a tree created open is closed at start, one closed
by another user is refused; over TLS a replica elects and delivers, and a plaintext client or
one that does not trust ZooKeeper's CA gets no session."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import make_digest_acl

from dev.stack import KDELAY, wait_until
from kdelay.buffer import Scheduled
from kdelay.delay_service.cli import status_command
from kdelay.delay_service.reshard.cli import reshard_command
from kdelay.proxy import running_proxy
from kdelay.zk import CheckpointStore, Election, Paths, Registry, Session
from kdelay.zk.errors import CoordinationError
from kdelay.zk.layout import ensure_layout
from kdelay.zk.replica_api import NoReplicaError, ReplicaApi
from kdelay.zk.security import ZkSecurity
from tests.support.infra import KafkaInfra
from tests.support.kafka_helpers import Record, consume_until, unique_topic
from tests.support.proxies import loopback_config
from tests.support.replicas import ReplicaSet
from tests.support.schedule import create_target, delivered_ids, produce_buffer
from tests.support.secure_zk import USER, SecureReplicaSet, SecureZooKeeper, secure_zookeeper

OPEN = "world:anyone"


@pytest.fixture(scope="module")
def secure_zk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureZooKeeper]:
    with secure_zookeeper(tmp_path_factory.mktemp("secure-zk")) as zk:
        yield zk


def tree(client: KazooClient, root: str) -> list[str]:
    """``root`` and every node below it."""
    out, pending = [], [root]
    while pending:
        path = pending.pop()
        out.append(path)
        pending.extend(f"{path}/{c}" for c in client.get_children(path))
    return sorted(out)


def acl_text(client: KazooClient, path: str) -> list[str]:
    acls, _ = client.get_acls(path)
    return [f"{a.id.scheme}:{a.id.id.split(':')[0]}:{a.perms}" for a in acls]


def deliver(kafka: KafkaInfra, rs: ReplicaSet, prefix: str, n: int = 40) -> None:
    """Schedule ``n`` messages due in a second through ``rs``'s buffer topic; wait for all."""
    topic = unique_topic(prefix)
    create_target(kafka.bootstrap_servers, topic, partitions=2)
    due = int(time.time() * 1000) + 1_000
    messages = [Scheduled(f"{prefix}-{i}", topic, i % 2, None, b"x", due) for i in range(n)]
    produce_buffer(kafka.bootstrap_servers, rs.buffer_topic, rs.partitions, messages)
    wanted = {m.id for m in messages}

    def done(records: list[Record]) -> bool:
        return wanted <= set(delivered_ids(records))

    records = consume_until(kafka.bootstrap_servers, [topic], done, timeout=90)
    assert set(delivered_ids(records)) == wanted


def allowed_to(client: KazooClient, path: str) -> list[str]:
    """Which of read, list, write, read the ACL and create a child ``client`` may do to
    ``path`` (kdelay's znodes: none)."""
    calls: list[tuple[str, Callable[[], object]]] = [
        ("get", partial(client.get, path)),
        ("get_children", partial(client.get_children, path)),
        ("set", partial(client.set, path, b"{}")),
        ("get_acls", partial(client.get_acls, path)),
        ("create under", partial(client.create, f"{path}/intruder")),
    ]
    out = []
    for what, call in calls:
        try:
            call()
        except NoAuthError:
            continue
        out.append(what)
    return out


def close_client(client: KazooClient) -> None:
    client.stop()
    client.close()


def test_replicas_with_digest_auth_elect_deliver_and_close_every_znode(
    kafka: KafkaInfra, secure_zk: SecureZooKeeper, tmp_path: Path
) -> None:
    expected = [f"digest:{USER}:31"]
    with SecureReplicaSet(
        tmp_path, kafka.bootstrap_servers, secure_zk.plain, count=2, zk=secure_zk
    ) as rs:
        rs.start_all()
        master = rs.wait_master(timeout=90)
        deliver(kafka, rs, "zkacl")
        wait_until(lambda: rs.checkpoint() is not None, timeout=30, what="a checkpoint")
        su = secure_zk.super_client()
        anon = secure_zk.client()
        wrong = secure_zk.client(auth_data=[("digest", f"{USER}:not-{secure_zk.password}")])
        try:
            nodes = tree(su, rs.root)
            [candidate, *_] = su.get_children(rs.paths.election)
            status_node = f"{rs.paths.replicas}/{master}"
            kdelay_nodes = [
                rs.root,
                rs.paths.election,
                f"{rs.paths.election}/{candidate}",  # ephemeral sequential
                rs.paths.replicas,
                status_node,  # ephemeral
                rs.paths.layout,
                rs.paths.epoch,
                rs.paths.checkpoint,
            ]
            assert set(kdelay_nodes) <= set(nodes)
            parent = rs.root.rsplit("/", 1)[0]  # created by the first replica (ensure_path)
            acls = {path: acl_text(su, path) for path in [parent, *nodes]}
            print(f"\n{len(acls)} znodes under {parent}: " + json.dumps(acls, sort_keys=True))
            assert {path: acl for path, acl in acls.items() if acl != expected} == {}

            for outsider in (anon, wrong):
                allowed = {path: allowed_to(outsider, path) for path in kdelay_nodes}
                assert {path: ops for path, ops in allowed.items() if ops} == {}
                for path in (f"{rs.paths.election}/{candidate}", status_node):
                    with pytest.raises(NoAuthError):
                        outsider.delete(path)
                with pytest.raises(NoAuthError):  # a lower candidate would steal the election
                    outsider.create(f"{rs.paths.election}/n_", ephemeral=True, sequence=True)
            assert rs.master() == master  # nothing the outsiders did changed anything

            # kdelay status and the proxy's replica questions log in the same way.
            zk_args = ["--zk-connect", secure_zk.plain, "--zk-root", rs.root, "--json"]
            env = {"KDELAY_ZK_AUTH_PASSWORD": secure_zk.password}
            ok = CliRunner().invoke(status_command, [*zk_args, "--zk-auth-username", USER], env=env)
            assert ok.exit_code == 0, ok.output
            assert json.loads(ok.output)["master"] == master
            refused = CliRunner().invoke(status_command, zk_args, env={})
            print(f"kdelay status without credentials: {refused.output.strip()}")
            assert refused.exit_code == 1
            assert "NoAuth" in refused.output
            assert "--zk-auth-username" in refused.output
            unknown = f"unknown-{uuid.uuid4().hex}"
            for login, expected_status in ((secure_zk.security(), 404), (ZkSecurity(), 503)):
                cfg = loopback_config(
                    kafka.bootstrap_servers,
                    zk_connect=secure_zk.plain,
                    zk_root=rs.root,
                    **login.model_dump(),
                )
                with running_proxy(cfg) as proxy:
                    assert proxy.addresses is not None
                    with httpx.Client(base_url=proxy.addresses.http, timeout=30) as http:
                        resp = http.get(f"/v1/messages/{unknown}")
                print(f"proxy GET /v1/messages as {login.zk_auth_username}: {resp.status_code}")
                assert resp.status_code == expected_status, resp.text
            api = ReplicaApi(secure_zk.plain, rs.root, security=secure_zk.security())
            anon_api = ReplicaApi(secure_zk.plain, rs.root)
            try:
                assert {r.name for r in api.shards()[0]} == set(rs.replicas)
                with pytest.raises(NoReplicaError, match="NoAuth"):
                    anon_api.shards()
            finally:
                api.close()
                anon_api.close()
        finally:
            for client in (su, anon, wrong):
                close_client(client)
        for replica in rs.replicas.values():
            assert secure_zk.password not in replica.log_text()


def test_an_open_tree_is_closed_when_replicas_start_with_credentials(
    kafka: KafkaInfra, secure_zk: SecureZooKeeper, tmp_path: Path
) -> None:
    root = f"/kdelay-open/{uuid.uuid4().hex[:10]}"
    buffer_topic = f"buffer-{uuid.uuid4().hex[:10]}"
    with ReplicaSet(
        tmp_path / "open",
        kafka.bootstrap_servers,
        secure_zk.plain,
        count=1,
        root=root,
        buffer_topic=buffer_topic,
    ) as before:
        before.start_all()
        before.wait_master(timeout=90)
        deliver(kafka, before, "zkopen")
        wait_until(lambda: before.checkpoint() is not None, timeout=30, what="a checkpoint")
    anon = secure_zk.client()
    su = secure_zk.super_client()
    try:
        opened = {path: acl_text(anon, path) for path in tree(anon, root)}
        assert all(acl == [f"{OPEN}:31"] for acl in opened.values()), opened  # the upgrade case
        with SecureReplicaSet(
            tmp_path / "closed",
            kafka.bootstrap_servers,
            secure_zk.plain,
            count=1,
            root=root,
            buffer_topic=buffer_topic,
            zk=secure_zk,
        ) as after:
            after.start_all()
            after.wait_master(timeout=90)
            deliver(kafka, after, "zkclosed")
            closed = {path: acl_text(su, path) for path in tree(su, root)}
            assert set(opened) <= set(closed)
            assert {p: a for p, a in closed.items() if a != [f"digest:{USER}:31"]} == {}
            with pytest.raises(NoAuthError):
                anon.get(f"{root}/checkpoint")
            [event] = [
                e
                for e in after.replicas["replica-1"].log_events()
                if e["event"] == "zk.tree_closed"
            ]
            print(f"\nupgrade: {event}")
            assert event["nodes"] == len(opened)
            assert event["acl"] == f"digest:{USER}"
    finally:
        close_client(anon)
        close_client(su)


def test_every_znode_of_a_sharded_set_carries_the_acl(secure_zk: SecureZooKeeper) -> None:
    """What a replica of shard 1 of 2 creates, through zk/'s own calls: the layout on the
    set's root, the shard's root, its election candidate, status node, epoch and checkpoint,
    and the parents ensure_path and makepath make on the way (three levels new here)."""
    top = f"/kdelay-shards-{uuid.uuid4().hex[:10]}"
    root = Paths(f"{top}/a/b")
    shard = root.shard(1, 2)
    session = Session(secure_zk.plain, 5.0, security=secure_zk.security(), close_root=root.root)
    session.start(timeout=15)
    su = secure_zk.super_client()
    try:
        ensure_layout(session.client, root, 2)
        Registry(session.client, shard, "r1").publish({"role": "follower"})
        Election(session.client, shard, "r1", lambda _leader: None).join()
        store = CheckpointStore(session.client, shard, "r1")
        store.claim_epoch()
        store.write(b"{}")
        nodes = tree(su, top)
        assert {shard.root, shard.checkpoint, shard.epoch, root.layout} <= set(nodes)
        assert len(su.get_children(shard.election)) == 1
        acls = {path: acl_text(su, path) for path in nodes}
        assert {p: a for p, a in acls.items() if a != [f"digest:{USER}:31"]} == {}
    finally:
        session.stop()
        close_client(su)


def test_kdelay_reshard_logs_in_and_its_new_shards_are_closed(secure_zk: SecureZooKeeper) -> None:
    root = f"/kdelay-reshard/{uuid.uuid4().hex[:10]}"
    session = Session(secure_zk.plain, 5.0, security=secure_zk.security(), close_root=root)
    session.start(timeout=15)
    ensure_layout(session.client, Paths(root), 1)
    session.stop()
    args = ["--zk-connect", secure_zk.plain, "--zk-root", root, "--shards", "2"]
    refused = CliRunner().invoke(reshard_command, args, env={})
    print(f"\nkdelay reshard without credentials: {refused.output.strip()}")
    assert refused.exit_code == 1
    assert "NoAuth" in refused.output
    env = {"KDELAY_ZK_AUTH_PASSWORD": secure_zk.password}
    done = CliRunner().invoke(reshard_command, [*args, "--zk-auth-username", USER], env=env)
    assert done.exit_code == 0, done.output
    assert "1 -> 2 shard(s)" in done.output
    su = secure_zk.super_client()
    try:
        nodes = tree(su, root)
        assert {f"{root}/shard-0/checkpoint", f"{root}/shard-1/checkpoint"} <= set(nodes)
        acls = {path: acl_text(su, path) for path in nodes}
        assert {p: a for p, a in acls.items() if a != [f"digest:{USER}:31"]} == {}
    finally:
        close_client(su)


def test_a_tree_closed_by_another_user_is_refused(secure_zk: SecureZooKeeper) -> None:
    root = f"/kdelay-taken/{uuid.uuid4().hex[:10]}"
    other = make_digest_acl("someone-else", "their-password", all=True)
    su = secure_zk.super_client()
    try:
        su.ensure_path(root)  # open (the super user's default ACL is world:anyone)
        su.create(f"{root}/checkpoint", b"{}", acl=[other])
        session = Session(secure_zk.plain, 5.0, security=secure_zk.security(), close_root=root)
        with pytest.raises(CoordinationError) as refused:
            session.start(timeout=15)
        print(f"\nrefused: {refused.value}")
        assert f"ZooKeeper node {root}/checkpoint is closed to" in str(refused.value)
        assert "zk_auth_username" in str(refused.value)
        assert secure_zk.password not in str(refused.value)
        assert acl_text(su, f"{root}/checkpoint") == ["digest:someone-else:31"]  # untouched
    finally:
        close_client(su)


def test_over_tls_a_replica_elects_and_delivers_and_plaintext_gets_no_session(
    kafka: KafkaInfra, secure_zk: SecureZooKeeper, tmp_path: Path
) -> None:
    with SecureReplicaSet(
        tmp_path, kafka.bootstrap_servers, secure_zk.tls, count=1, zk=secure_zk, tls=True
    ) as rs:
        rs.start_all()
        rs.wait_master(timeout=90)
        deliver(kafka, rs, "zktls")
        assert "ZooKeeper unreachable" not in rs.replicas["replica-1"].log_text()
    plain = KazooClient(hosts=secure_zk.tls, timeout=3.0)
    with pytest.raises(KazooTimeoutError):
        plain.start(timeout=5)
    close_client(plain)
    # TLS without ZooKeeper's CA (the system's CAs): its certificate is not trusted. In a
    # process of its own, as a user runs it (kazoo 2.11 leaves the socket of a failed handshake
    # to the collector, which the test run's warnings-as-errors would report).
    untrusting = subprocess.run(
        [KDELAY, "status", "--zk-connect", secure_zk.tls, "--zk-tls", "--timeout", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    print(f"\nTLS without the CA: exit {untrusting.returncode}: {untrusting.stderr.strip()}")
    assert untrusting.returncode == 2
    assert "ZooKeeper unreachable" in untrusting.stderr
