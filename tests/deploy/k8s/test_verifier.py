"""helm/kdelay's verifier (verifier.enabled) on a real Kubernetes, with two executor pods (issue
38, point 5). The tests run in file order and share the verifier.

The chart's verifier objects (``helm template --show-only`` of its three templates: the
StatefulSet of one driver and its claim, its ServiceAccount/Role/RoleBinding, the metrics
Service) are applied to their own namespace; the rest of the release is test_chart.py's
subject. The driver (``kdelay verify``, Spark's client mode in its pod) creates two executor
pods from the verifier image through the API, whose entrypoint turns Spark's ``executor`` into
a Spark executor. The scenario is test_verifier_continuous's (tests/support/
verifier_scenarios.py: a lost, a cancelled, a duplicated, a bulk-cancelled message ...),
written to Kafka in the cluster; the window's totals come out on the output topic exactly as
on ``local[2]`` and on a standalone cluster, and the driver's /metrics counts the same. Each
executor pod ran tasks (its log). The executor pods are owned by the driver's pod: deleting
that pod deletes them, and the StatefulSet's new driver starts two new ones and resumes from
the checkpoint (a ReadWriteMany claim the driver and the executors mount) without counting
twice.
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dev.k8s import kube
from dev.k8s.settings import Layout
from tests.support.kafka_helpers import consume_until
from tests.support.verifier_scenarios import (
    STREAM_GRACE_MS,
    WINDOW_OF_20,
    next_base,
    produce_scenario,
    scenario_topics,
    settled,
    window_totals,
)

NAMESPACE = "kdelay-verifier"
RELEASE = "kv"
SELECTOR = "app.kubernetes.io/component=verifier"
EXECUTORS = "spark-role=executor"
TEMPLATES = ("verifier-rbac.yaml", "verifier-statefulset.yaml", "verifier-service.yaml")
TIMEOUT = 420.0
#: The two windows' starts the first test fills, for the second.
WINDOWS: list[int] = []


def _kubectl(lay: Layout, *args: str, stdin: str | None = None) -> str:
    result = kube.kubectl(lay, "-n", NAMESPACE, *args, check=False, stdin=stdin, timeout=300)
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def _pods(lay: Layout, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.get_json(lay, "-n", NAMESPACE, "pods", "-l", selector)[
        "items"
    ]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["status"].get("phase") == "Running"]


def _wait(condition: Callable[[], bool], what: str, lay: Layout, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            described = kube.kubectl(
                lay, "-n", NAMESPACE, "get", "pods,events", "-o", "wide", check=False
            ).stdout
            logs = kube.kubectl(
                lay, "-n", NAMESPACE, "logs", "-l", SELECTOR, "--tail=60", check=False
            ).stdout
            pytest.fail(f"{what} within {timeout:.0f} s\n{described}\n{logs}")
        time.sleep(2)  # sleep: the poll interval of a wait with a deadline (the API server)


@pytest.fixture(scope="module")
def topics(kafka_zookeeper: tuple[str, str]) -> tuple[str, str, str]:
    return scenario_topics(kafka_zookeeper[0], "k8s")


@pytest.fixture(scope="module")
def verifier(
    k8s: Layout, kafka_zookeeper: tuple[str, str], topics: tuple[str, str, str]
) -> Iterator[str]:
    """The chart's verifier objects, applied; yields the manifests."""
    bootstrap, _ = kafka_zookeeper
    buffer_topic, target, out_topic = topics
    sets = {
        "verifier.enabled": "true",
        "kafka.bootstrapServers": bootstrap,
        "verifier.bufferTopic": buffer_topic,
        "verifier.topics": target,
        "verifier.outputTopic": out_topic,
        "verifier.graceMs": str(STREAM_GRACE_MS),
        "verifier.window": "10s",
        "verifier.trigger": "500ms",
        "verifier.driverMemory": "512m",
        "verifier.executors.memory": "512m",
        "verifier.executors.requestCores": "100m",
        "verifier.resources.requests.cpu": "100m",
        "verifier.resources.requests.memory": "1Gi",
        "verifier.resources.limits.memory": "1536Mi",
        "verifier.extraArgs[0]": "--early-horizon-ms=1000",
        "verifier.persistence.enabled": "true",
        "verifier.persistence.size": "1Gi",
    }
    argv = [str(k8s.helm), "template", RELEASE, str(k8s.root / "helm" / "kdelay")]
    argv += ["--namespace", NAMESPACE]
    for key, value in sets.items():
        argv += [
            "--set-string" if key.endswith(("Cores", "Topic", "topics")) else "--set",
            f"{key}={value}",
        ]
    for template in TEMPLATES:
        argv += ["--show-only", f"templates/{template}"]
    rendered = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    kube.kubectl(k8s, "create", "namespace", NAMESPACE, check=False)
    began = time.monotonic()
    _kubectl(k8s, "apply", "-f", "-", stdin=rendered.stdout)
    try:
        yield rendered.stdout
    finally:
        kube.kubectl(
            k8s,
            "-n",
            NAMESPACE,
            "delete",
            "-f",
            "-",
            "--wait=true",
            "--timeout=180s",
            check=False,
            stdin=rendered.stdout,
            timeout=240,
        )
        kube.kubectl(
            k8s, "delete", "namespace", NAMESPACE, "--timeout=180s", check=False, timeout=240
        )
        print(f"verifier objects applied and removed in {time.monotonic() - began:.1f} s")


def _driver(lay: Layout) -> dict[str, Any]:
    (pod,) = _running(_pods(lay, SELECTOR))
    return pod


def _executors_of(lay: Layout, driver: dict[str, Any]) -> list[dict[str, Any]]:
    """The running executor pods the driver's pod owns (by uid: a StatefulSet's new pod has
    the old one's name)."""
    uid = driver["metadata"]["uid"]
    return [
        p
        for p in _running(_pods(lay, EXECUTORS))
        if any(o["uid"] == uid for o in p["metadata"].get("ownerReferences", []))
    ]


def _metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()  # noqa: S310 - the pod's IP
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in {url}"
    return float(found.group(1))


def test_the_charts_verifier_runs_with_two_executor_pods_and_counts_exactly(
    k8s: Layout,
    kafka_zookeeper: tuple[str, str],
    topics: tuple[str, str, str],
    verifier: str,
) -> None:
    bootstrap, _ = kafka_zookeeper
    buffer_topic, target, out_topic = topics
    began = time.monotonic()
    _wait(lambda: len(_running(_pods(k8s, SELECTOR))) == 1, "the driver pod did not run", k8s)
    driver = _driver(k8s)
    _wait(
        lambda: len(_executors_of(k8s, driver)) == 2,
        f"two executor pods owned by {driver['metadata']['name']} did not run",
        k8s,
    )
    print(f"driver and two executors running in {time.monotonic() - began:.1f} s")
    # Spark's RPC is authenticated (the chart's spark.authenticate): each executor pod is given
    # the application's secret, without which the driver would refuse it.
    for pod in _executors_of(k8s, driver):
        (container,) = pod["spec"]["containers"]
        assert "_SPARK_AUTH_SECRET" in {e["name"] for e in container.get("env", [])}
    first = next_base() - 1_000
    produce_scenario(bootstrap, (buffer_topic, target), first + 1_000, 20, "a")
    second = next_base(first + 1_000 + STREAM_GRACE_MS) - 1_000
    # The second window's messages move the watermark past the first (due + grace).
    produce_scenario(bootstrap, (buffer_topic, target), second + 1_000, 20, "b")
    WINDOWS[:] = [first, second]
    published = consume_until(bootstrap, [out_topic], settled([first]), timeout=TIMEOUT)
    assert window_totals(published, first) == WINDOW_OF_20
    print(f"first window verified {time.monotonic() - began:.1f} s after apply")
    # The driver's Prometheus figures (the verifier Service's target) count that window too.
    ip = _driver(k8s)["status"]["podIP"]
    url = f"http://{ip}:9500/metrics"
    assert _metric(url, "kdelay_verifier_missing_total") >= 1
    assert _metric(url, "kdelay_verifier_duplicates_total") >= 1
    assert _metric(url, "kdelay_verifier_early_total") == 0
    assert _metric(url, "kdelay_verifier_lateness_seconds_count") >= 16
    # Both executor pods ran tasks: the work was spread over the cluster's pods.
    for pod in _executors_of(k8s, driver):
        log = _kubectl(k8s, "logs", pod["metadata"]["name"])
        assert "Running task" in log, f"{pod['metadata']['name']} ran no task:\n{log[-2000:]}"


def test_a_new_driver_resumes_from_the_checkpoint_with_new_executor_pods(
    k8s: Layout,
    kafka_zookeeper: tuple[str, str],
    topics: tuple[str, str, str],
    verifier: str,
) -> None:
    """The driver's pod deleted while the second window is open: its executor pods go with it
    (owner references), the StatefulSet's new driver starts two new ones and resumes from the
    checkpoint on the claim they all mount. A third window closes the second, which comes out
    right, and the first is not published again (no double counting)."""
    bootstrap, _ = kafka_zookeeper
    buffer_topic, target, out_topic = topics
    old = _driver(k8s)
    old_executors = {p["metadata"]["name"] for p in _executors_of(k8s, old)}
    assert len(old_executors) == 2
    began = time.monotonic()
    _kubectl(k8s, "delete", "pod", old["metadata"]["name"], "--wait=false")
    _wait(
        lambda: not {p["metadata"]["name"] for p in _pods(k8s, EXECUTORS)} & old_executors,
        f"the executor pods of the deleted driver {old['metadata']['name']} were not deleted",
        k8s,
    )

    def new_driver_with_two() -> bool:
        drivers = [
            p
            for p in _running(_pods(k8s, SELECTOR))
            if p["metadata"]["uid"] != old["metadata"]["uid"]
        ]
        return len(drivers) == 1 and len(_executors_of(k8s, drivers[0])) == 2

    _wait(new_driver_with_two, "the StatefulSet's new driver did not start two executors", k8s)
    print(f"new driver and executors running {time.monotonic() - began:.1f} s after the delete")
    first, second = WINDOWS
    produce_scenario(
        bootstrap, (buffer_topic, target), next_base(second + STREAM_GRACE_MS), 10, "c"
    )
    published = consume_until(bootstrap, [out_topic], settled([first, second]), timeout=TIMEOUT)
    assert window_totals(published, first) == WINDOW_OF_20
    assert window_totals(published, second) == WINDOW_OF_20
