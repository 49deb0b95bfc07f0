"""helm/kdelay installed on a real Kubernetes: Ready, traffic, failover, upgrade, rollback,
drain, uninstall. The tests run in file order on one release and share its state.

The proxy's Service is a NodePort on the node's own address (10.87.0.1:30092, never the
machine's interfaces) and the proxy advertises exactly that (``proxy.advertised.mode: fixed``),
so the tests' producer on the host sends every request through the Service. Deliveries are read
straight from Kafka with read_committed; a delivery is early when its LogAppendTime precedes
its ``kdelay-deliver-at``. Figures (install-to-Ready, failover gap, duplicates) are printed with
``-s`` and appended to ``.kdelay/k8s/test-report.jsonl``; a failover's gap is also asserted below
the bound the chart's own settings give it (``_failover_bound_ms``).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dev.k8s import kube
from dev.k8s.settings import NODE_IP, NODE_NAME, Layout
from dev.stack import wait_until
from kdelay import headers as h
from tests.support.kafka_helpers import Record, create_topic, unique_topic
from tests.support.stream import DelayedStream, read_deliveries
from tests.support.up import cluster_status, confirmed_master, roles

NAMESPACE = "kdelay"
RELEASE = "kdelay"
PARTITIONS = 4
PROXY_NODE_PORT = 30092
TIMEOUT = 300.0
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
#: What a new master needs once it has won, beyond the chart's own settings: its transactional
#: producer initialised and the last checkpoint read (README, Failover time: 1.5 to 2 s on a
#: loaded 2-core machine), with a wide margin: the bound below is a correctness limit, not a
#: speed figure.
ACTIVATION_BUDGET_MS = 30_000


def _failover_bound_ms(chart: Path) -> int:
    """The longest a failover may stop delivery under the chart's defaults: a deleted master
    steps down within its pod's termination grace period (else the kubelet SIGKILLs it), a
    killed master's election node outlives it by the ZooKeeper session timeout, and then the
    next candidate activates. Longer means a standby never took over (or waited on the old
    pod's restart), which is the failure this bounds."""
    values = yaml.safe_load((chart / "values.yaml").read_text())["delayService"]
    grace_s = int(values["terminationGracePeriodSeconds"])
    session_s = float(values["zkSessionTimeoutSeconds"])
    return int((grace_s + session_s) * 1000) + ACTIVATION_BUDGET_MS


@dataclass
class Release:
    lay: Layout
    kafka: str
    zk_connect: str
    zk_root: str
    chart: str
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def proxy(self) -> str:
        return f"{NODE_IP}:{PROXY_NODE_PORT}"

    def helm(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        argv = [str(self.lay.helm), f"--kubeconfig={self.lay.kubeconfig}", "-n", NAMESPACE]
        result = subprocess.run(
            [*argv, *args], capture_output=True, text=True, check=False, timeout=timeout
        )
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}{result.stdout}"
        return result

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return kube.kubectl(self.lay, "-n", NAMESPACE, *args, check=check, timeout=300)

    def pods(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = kube.get_json(
            self.lay, "-n", NAMESPACE, "pods", "-l", SELECTOR
        )["items"]
        return items

    def ready_pods(self) -> list[str]:
        ready = []
        for pod in self.pods():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            conditions = pod["status"].get("conditions", [])
            if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
                ready.append(pod["metadata"]["name"])
        return ready

    def all_ready(self, want: int = 5) -> bool:
        pods = [p for p in self.pods() if not p["metadata"].get("deletionTimestamp")]
        return len(pods) == want and len(self.ready_pods()) == want

    def status(self) -> dict[str, Any]:
        return cluster_status(self.zk_connect, self.zk_root)

    def roles(self) -> dict[str, str]:
        return roles(self.status())

    def master(self) -> str | None:
        return confirmed_master(self.status())

    def describe(self) -> str:
        out = self.kubectl("get", "pods,pvc,svc,events", "-o", "wide", check=False)
        logs = []
        for pod in self.pods():
            name = pod["metadata"]["name"]
            log = self.kubectl("logs", name, "--tail=30", check=False)
            logs.append(f"--- {name}\n{log.stdout}{log.stderr}")
        return out.stdout + "\n".join(logs)

    def record(self, name: str, value: Any) -> None:
        self.figures[name] = value
        print(f"k8s figure: {name} = {json.dumps(value)}")
        with (self.lay.state / "test-report.jsonl").open("a") as out:
            out.write(json.dumps({"at": time.time(), name: value}) + "\n")


def _values(kafka: str, zk_connect: str, zk_root: str) -> list[str]:
    sets = {
        "kafka.bootstrapServers": kafka,
        "zookeeper.connect": zk_connect,
        "zookeeper.root": zk_root,
        "bufferPartitions": str(PARTITIONS),
        "proxy.advertised.mode": "fixed",
        "proxy.advertised.host": NODE_IP,
        "proxy.advertised.port": str(PROXY_NODE_PORT),
        "proxy.service.type": "NodePort",
        "proxy.service.nodePorts.kafka": str(PROXY_NODE_PORT),
        # Two cores for the whole node: small requests, so a rolling update's surge pod fits.
        "proxy.resources.requests.cpu": "50m",
        "proxy.resources.requests.memory": "128Mi",
        "delayService.resources.requests.cpu": "50m",
        "delayService.resources.requests.memory": "128Mi",
        "delayService.persistence.size": "1Gi",
    }
    args = []
    for key, value in sets.items():
        args += ["--set-string" if key.endswith(("Servers", "connect", "host")) else "--set",
                 f"{key}={value}"]  # fmt: skip
    return args


@pytest.fixture(scope="module")
def release(k8s: Layout, kafka_zookeeper: tuple[str, str]) -> Iterator[Release]:
    kafka, zk_connect = kafka_zookeeper
    zk_root = f"/kdelay-k8s-{uuid.uuid4().hex[:8]}"
    rel = Release(k8s, kafka, zk_connect, zk_root, str(k8s.root / "helm" / "kdelay"))
    kube.kubectl(k8s, "delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true",
                 timeout=300)  # fmt: skip
    yield rel
    print("k8s figures: " + json.dumps(rel.figures))
    subprocess.run(
        [str(k8s.helm), f"--kubeconfig={k8s.kubeconfig}", "-n", NAMESPACE, "uninstall", RELEASE],
        capture_output=True,
        check=False,
    )
    kube.kubectl(k8s, "delete", "namespace", NAMESPACE, "--wait=true", check=False, timeout=300)


def _deliveries(kafka: str, topic: str, want: set[str]) -> list[Record]:
    return read_deliveries(kafka, topic, want, partitions=PARTITIONS, timeout=TIMEOUT)


def _max_gap(records: list[Record], start_ms: int, end_ms: int) -> int:
    """The longest pause between consecutive deliveries (LogAppendTime) from ``start_ms`` to
    ``end_ms``, counting from the last delivery before ``start_ms`` (the host and the broker
    share one clock here)."""
    stamps = sorted(r.timestamp_ms for r in records)
    window = [t for t in stamps if t <= start_ms][-1:]
    window += [t for t in stamps if start_ms < t <= end_ms]
    return max((b - a for a, b in itertools.pairwise(window)), default=0)


def _judge(rel: Release, name: str, stream: DelayedStream, topic: str) -> list[Record]:
    """0 lost, 0 early (LogAppendTime), 0 duplicates (exactly-once, read_committed); the
    lateness and the longest gap, recorded."""
    assert stream.failed == [], stream.failed[:5]
    records = _deliveries(rel.kafka, topic, stream.acked)
    delivered = {(r.header(h.ID) or b"").decode() for r in records}
    early = [r for r in records if r.timestamp_ms < int(r.header(h.DELIVER_AT) or b"0")]
    late = sorted(r.timestamp_ms - int(r.header(h.DELIVER_AT) or b"0") for r in records)
    # The stream's deliveries fall due about 40 a second: the longest pause between two
    # consecutive appends (LogAppendTime) is the gap a failover or a roll caused.
    stamps = sorted(r.timestamp_ms for r in records)
    figures = {
        "sent": stream.sent,
        "acknowledged": len(stream.acked),
        "lost": len(stream.acked - delivered),
        "early": len(early),
        "duplicates": len(records) - len(delivered),
        "lateness_ms_p50": late[len(late) // 2],
        "lateness_ms_p99": late[int(len(late) * 0.99)],
        "lateness_ms_max": late[-1],
        "max_delivery_gap_ms": max(b - a for a, b in itertools.pairwise(stamps)),
    }
    rel.record(name, figures)
    assert figures["lost"] == 0
    assert early == [], f"{len(early)} delivered before their due time, e.g. {early[:3]}"
    # The chart's default is exactly-once, and these are read read_committed: none twice.
    assert figures["duplicates"] == 0, figures
    return records


def _stream(rel: Release, prefix: str) -> tuple[DelayedStream, str]:
    topic = unique_topic(prefix)
    create_topic(rel.kafka, topic, PARTITIONS, config=LOG_APPEND_TIME)
    stream = DelayedStream(rel.proxy, topic, prefix=prefix, partitions=PARTITIONS)
    stream.start()
    wait_until(lambda: stream.acked_count() >= 100, timeout=TIMEOUT, what=f"{prefix}: flowing")
    return stream, topic


def test_install_becomes_ready(release: Release) -> None:
    began = time.monotonic()
    release.helm("install", RELEASE, release.chart, "--create-namespace",
                 *_values(release.kafka, release.zk_connect, release.zk_root))  # fmt: skip
    try:
        wait_until(release.all_ready, timeout=600, what="every pod Ready", interval=1.0)
        ready_at = time.monotonic() - began
        wait_until(
            lambda: release.master() is not None and len(release.roles()) == 3,
            timeout=TIMEOUT,
            what="a master among 3 replicas in `kdelay status`",
            interval=1.0,
        )
    except Exception:
        print(release.describe())
        raise
    release.record("install_to_ready_s", round(ready_at, 1))
    release.record("install_to_master_s", round(time.monotonic() - began, 1))


def test_a_pod_reaches_the_proxy_by_its_service_name(release: Release) -> None:
    """Cluster DNS and the Service from inside: a pod runs `kdelay send` against the proxy
    Service's name; its output comes back through `kubectl logs` (the kubelet's API on the
    node address) and the message is delivered, not early."""
    topic = unique_topic("k8s-dns")
    create_topic(release.kafka, topic, 1, config=LOG_APPEND_TIME)
    services = kube.get_json(
        release.lay, "-n", NAMESPACE, "svc", "-l", f"{SELECTOR},app.kubernetes.io/component=proxy"
    )["items"]
    service = next(s["metadata"]["name"] for s in services if s["spec"].get("clusterIP") != "None")
    bootstrap = f"{service}.{NAMESPACE}.svc.cluster.local:9092"
    release.kubectl(
        "run", "kdelay-client", "--restart=Never", "--image=kdelay/kdelay:0.1.0",
        "--image-pull-policy=IfNotPresent", "--", "send", "--bootstrap-servers", bootstrap,
        "--topic", topic, "--delay", "2s", "--id", "dns-1", "hello from a pod",
    )  # fmt: skip

    def phase() -> str:
        return str(_pod_of(release, "kdelay-client")["status"].get("phase", ""))

    try:
        wait_until(lambda: phase() in ("Succeeded", "Failed"), timeout=TIMEOUT, what="the client")
        logs = release.kubectl("logs", "kdelay-client").stdout
        assert phase() == "Succeeded", logs
    finally:
        release.kubectl("delete", "pod", "kdelay-client", "--wait=false", check=False)
    records = read_deliveries(release.kafka, topic, {"dns-1"}, partitions=1)
    assert [r.timestamp_ms >= int(r.header(h.DELIVER_AT) or b"0") for r in records] == [True]
    release.record("dns_client", {"bootstrap": bootstrap, "kubectl_logs": logs.strip()[-200:]})


def _pod_of(release: Release, name: str) -> dict[str, Any]:
    return kube.get_json(release.lay, "-n", NAMESPACE, "pod", name)


def _restarts(pod: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount", 0)) for c in pod["status"].get("containerStatuses", []))


def _sigkill_container(pod: dict[str, Any]) -> int:
    """SIGKILL every process of the pod's container from the host, as a crash or the OOM
    killer would (the kubelet then restarts it in the same pod); how many were killed."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("://")[-1]
    pids: set[int] = set()
    trees = [Path("/sys/fs/cgroup/pids/kubepods"), Path("/sys/fs/cgroup/kubepods")]  # v1, v2
    for procs in (p for tree in trees if tree.exists() for p in tree.rglob("cgroup.procs")):
        if procs.parent.name == container_id:
            pids.update(int(p) for p in procs.read_text().split())
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return len(pids)


def _failover(release: Release, how: str) -> dict[str, Any]:
    """Take the master away (``delete``, ``force-delete`` its pod, or ``sigkill`` its
    container) and wait for a new master and for the old one back as a follower."""
    victim = release.master()
    assert victim is not None
    before = _pod_of(release, victim)
    deleted_at_ms = int(time.time() * 1000)
    began = time.monotonic()
    if how == "sigkill":
        assert _sigkill_container(before) > 0, f"no process found for pod {victim}"
    else:
        force = ["--grace-period=0", "--force"] if how == "force-delete" else []
        release.kubectl("delete", "pod", victim, "--wait=false", *force)
    wait_until(
        lambda: release.master() not in (None, victim),
        timeout=TIMEOUT,
        what=f"a new master after {how} of {victim}",
        interval=0.2,
    )
    new_master_s = time.monotonic() - began

    def back() -> bool:
        pod = _pod_of(release, victim)
        if how == "sigkill":
            replaced = _restarts(pod) > _restarts(before)
        else:
            replaced = pod["metadata"]["uid"] != before["metadata"]["uid"]
        return replaced and release.roles().get(victim) == "follower" and release.all_ready()

    wait_until(back, timeout=TIMEOUT, what=f"{victim} back, Ready, a follower", interval=1.0)
    return {
        "master": victim,
        "how": how,
        "deleted_at_ms": deleted_at_ms,
        "new_master": release.master(),
        "new_master_named_after_s": round(new_master_s, 2),
        "old_master_back_as_follower_after_s": round(time.monotonic() - began, 1),
    }


def _wait_for_more(stream: DelayedStream, count: int) -> None:
    after = stream.acked_count() + count
    wait_until(lambda: stream.acked_count() >= after, timeout=TIMEOUT, what=f"{count} more acks")


def test_taking_the_master_away_loses_nothing(release: Release) -> None:
    stream, topic = _stream(release, "k8s-failover")
    failovers = []
    try:
        for how in ("delete", "force-delete", "sigkill"):
            failovers.append(_failover(release, how))
            _wait_for_more(stream, 100)
    finally:
        stream.finish()
    records = _judge(release, "failover_delivery", stream, topic)
    marks = [f.pop("deleted_at_ms") for f in failovers]
    # The same stream before the first failover: the pauses it has anyway.
    release.record("steady_delivery_gap_ms", _max_gap(records, 0, marks[0]))
    for failover, start, end in zip(
        failovers, marks, [*marks[1:], marks[-1] + 20_000], strict=True
    ):
        failover["delivery_gap_ms"] = _max_gap(records, start, end)
        release.record(f"failover_{failover['how']}", failover)
    bound_ms = _failover_bound_ms(Path(release.chart))
    for failover in failovers:
        assert failover["delivery_gap_ms"] < bound_ms, (failover, bound_ms)


def _pod_uids(release: Release) -> set[str]:
    return {p["metadata"]["uid"] for p in release.pods()}


def test_upgrade_with_a_changed_value_rolls_the_pods_without_loss(release: Release) -> None:
    before = _pod_uids(release)
    stream, topic = _stream(release, "k8s-upgrade")
    began = time.monotonic()
    try:
        release.helm("upgrade", RELEASE, release.chart, "--reuse-values", "--wait",
                     "--timeout=15m", "--set", "delayService.checkpointIntervalMs=200",
                     "--set-string", "proxy.podAnnotations.kdelay\\.dev/upgrade=2")  # fmt: skip
        wait_until(release.all_ready, timeout=TIMEOUT, what="every pod Ready after the upgrade")
        took = time.monotonic() - began
        after = stream.acked_count() + 100
        wait_until(lambda: stream.acked_count() >= after, timeout=TIMEOUT, what="100 more acks")
    finally:
        stream.finish()
    assert _pod_uids(release) & before == set(), "the upgrade left pods of the old revision"
    release.record("upgrade_s", round(took, 1))
    _judge(release, "upgrade_delivery", stream, topic)


def test_rollback_restores_the_first_revision_without_loss(release: Release) -> None:
    stream, topic = _stream(release, "k8s-rollback")
    began = time.monotonic()
    try:
        release.helm("rollback", RELEASE, "1", "--wait", "--timeout=15m")
        wait_until(release.all_ready, timeout=TIMEOUT, what="every pod Ready after the rollback")
        took = time.monotonic() - began
        after = stream.acked_count() + 100
        wait_until(lambda: stream.acked_count() >= after, timeout=TIMEOUT, what="100 more acks")
    finally:
        stream.finish()
    values = json.loads(release.helm("get", "values", RELEASE, "-o", "json").stdout)
    assert "checkpointIntervalMs" not in values.get("delayService", {})
    for pod in release.pods():
        assert "kdelay.dev/upgrade" not in pod["metadata"].get("annotations", {})
    history = json.loads(release.helm("history", RELEASE, "-o", "json").stdout)
    assert [r["revision"] for r in history] == [1, 2, 3]
    release.record("rollback_s", round(took, 1))
    _judge(release, "rollback_delivery", stream, topic)


def test_drain_respects_the_disruption_budgets(release: Release) -> None:
    drain = kube.kubectl(
        release.lay, "drain", NODE_NAME, f"--pod-selector={SELECTOR}", "--ignore-daemonsets",
        "--delete-emptydir-data", "--timeout=60s", check=False, timeout=180,
    )  # fmt: skip
    try:
        pods = [p for p in release.pods() if not p["metadata"].get("deletionTimestamp")]
        ready = set(release.ready_pods())
        unavailable: dict[str, int] = {}
        for pod in pods:
            component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
            if pod["metadata"]["name"] not in ready:
                unavailable[component] = unavailable.get(component, 0) + 1
        release.record("drain", {"exit": drain.returncode, "unavailable": unavailable})
        # One node: each evicted pod's replacement cannot be scheduled, so after one eviction
        # per component the budgets (maxUnavailable 1) refuse the rest and the drain times out.
        assert drain.returncode != 0, drain.stdout
        assert "disruption budget" in drain.stderr + drain.stdout
        assert unavailable, "the drain evicted nothing"
        assert all(n <= 1 for n in unavailable.values()), unavailable
        assert len(ready) >= 3, ready
    finally:
        kube.kubectl(release.lay, "uncordon", NODE_NAME)
    wait_until(release.all_ready, timeout=TIMEOUT, what="every pod Ready after uncordon")


def test_uninstall_leaves_only_the_claims(release: Release) -> None:
    release.helm("uninstall", RELEASE, "--wait", "--timeout=5m")
    wait_until(lambda: release.pods() == [], timeout=TIMEOUT, what="every pod gone")
    kinds = "all,configmap,secret,serviceaccount,pdb,pvc,endpoints,role,rolebinding"
    left = kube.get_json(release.lay, "-n", NAMESPACE, kinds)["items"]
    left = [i for i in left if i["metadata"]["name"] not in ("kube-root-ca.crt", "default")]
    kinds_left = sorted({i["kind"] for i in left})
    release.record("uninstall_left", sorted(f"{i['kind']}/{i['metadata']['name']}" for i in left))
    assert kinds_left == ["PersistentVolumeClaim"], kinds_left
    assert len(left) == 3


def test_shards_install_each_with_its_master_and_its_partitions(release: Release) -> None:
    """delayService.shards=2: a StatefulSet of two replicas per shard, each shard
    electing its own master and ingesting only its buffer partitions; a stream through the
    proxy loses nothing, none early or twice, while one shard's master pod is deleted."""
    zk_root = release.zk_root + "-sharded"
    sharded = Release(release.lay, release.kafka, release.zk_connect, zk_root, release.chart)
    values = _values(release.kafka, release.zk_connect, zk_root)
    began = time.monotonic()
    shard_values = ["--set", "delayService.shards=2", "--set", "delayService.replicaCount=2"]
    sharded.helm("install", RELEASE, sharded.chart, *values, *shard_values)
    try:
        wait_until(lambda: sharded.all_ready(want=6), timeout=600, what="every pod Ready")
        wait_until(
            lambda: all(s["master"] for s in sharded.status()["shards"]),
            timeout=TIMEOUT,
            what="a master in each of the 2 shards",
            interval=1.0,
        )
    except Exception:
        print(sharded.describe())
        raise
    sharded.record("sharded_install_to_masters_s", round(time.monotonic() - began, 1))
    shards = sharded.status()["shards"]
    assert [len(s["replicas"]) for s in shards] == [2, 2]
    stream, topic = _stream(sharded, "k8s-shards")
    try:
        victim = str(sharded.status()["shards"][1]["master"])
        sharded.kubectl("delete", "pod", victim, "--wait=false")
        wait_until(
            lambda: sharded.status()["shards"][1]["master"] not in (None, victim),
            timeout=TIMEOUT,
            what="another master in shard 1",
            interval=0.5,
        )
        after = stream.acked_count() + 100
        wait_until(lambda: stream.acked_count() >= after, timeout=TIMEOUT, what="100 more acks")
    finally:
        stream.finish()
    _judge(sharded, "sharded_delivery", stream, topic)
    for shard in sharded.status()["shards"]:
        for replica in shard["replicas"]:
            partitions = {int(p) for p in replica["offsets"]}
            assert all(p % 2 == shard["shard"] for p in partitions), (replica["name"], partitions)
    sharded.helm("uninstall", RELEASE, "--wait", "--timeout=5m")
