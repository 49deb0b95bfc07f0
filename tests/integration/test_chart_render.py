"""Assertions on `helm template` output of helm/kdelay: the properties the chart promises.

Strimzi-style unit tests, written as pytest on the rendered YAML (helm-unittest is a plugin
binary; pytest needs nothing beyond helm itself).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy_tools import (
    CHART,
    Tools,
    find,
    helm_template,
    helm_template_text,
    one,
)

CI = CHART / "ci"


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def test_statefulset_claims_one_volume_per_replica(tools: Tools) -> None:
    docs = helm_template(tools, sets={"delayService.replicaCount": "4"})
    sts = one(docs, "StatefulSet", "-delay-service")
    assert sts["spec"]["replicas"] == 4
    claims = sts["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    assert claims[0]["spec"]["resources"]["requests"]["storage"] == "10Gi"
    mounts = {m["name"]: m["mountPath"] for m in _container(sts)["volumeMounts"]}
    assert mounts["data"] == "/var/lib/kdelay"
    volumes = {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert "data" not in volumes, "with persistence the data volume comes from the claim template"
    assert sts["spec"]["serviceName"] == one(docs, "Service", "-headless")["metadata"]["name"]
    assert not find(docs, "PersistentVolumeClaim"), "claims belong in volumeClaimTemplates"


def test_persistence_off_renders_no_claims(tools: Tools) -> None:
    docs = helm_template(tools, values=[CI / "persistence-off-values.yaml"])
    sts = one(docs, "StatefulSet", "-delay-service")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert "persistentVolumeClaimRetentionPolicy" not in sts["spec"]
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}


def test_storage_class_dash_means_no_class(tools: Tools) -> None:
    docs = helm_template(tools, sets={"delayService.persistence.storageClass": "-"})
    claim = one(docs, "StatefulSet")["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["storageClassName"] == ""
    docs = helm_template(tools, sets={"delayService.persistence.storageClass": "ssd"})
    assert (
        one(docs, "StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"]
        == "ssd"
    )


def test_pod_disruption_budgets(tools: Tools) -> None:
    docs = helm_template(tools)
    for component in ("proxy", "delay-service"):
        pdb = one(docs, "PodDisruptionBudget", f"-{component}")
        assert pdb["spec"]["maxUnavailable"] == 1
        assert "minAvailable" not in pdb["spec"]
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == component
    five = helm_template(tools, values=[CI / "five-replicas-values.yaml"])
    pdb = one(five, "PodDisruptionBudget", "-delay-service")
    assert pdb["spec"] == {"minAvailable": 3, "selector": pdb["spec"]["selector"]}
    off = helm_template(
        tools, sets={"delayService.pdb.create": "false", "proxy.pdb.create": "false"}
    )
    assert not find(off, "PodDisruptionBudget")


def test_pdb_selects_the_pods_it_protects(tools: Tools) -> None:
    docs = helm_template(tools)
    for kind, component in (("Deployment", "proxy"), ("StatefulSet", "delay-service")):
        labels = one(docs, kind)["spec"]["template"]["metadata"]["labels"]
        selector = one(docs, "PodDisruptionBudget", f"-{component}")["spec"]["selector"]
        assert selector["matchLabels"].items() <= labels.items()


def test_probes_default_on_toggleable_and_overridable(tools: Tools) -> None:
    docs = helm_template(tools)
    proxy = _container(one(docs, "Deployment", "-proxy"))
    assert proxy["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert proxy["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert proxy["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert "enabled" not in proxy["livenessProbe"]
    replica = _container(one(docs, "StatefulSet"))
    assert replica["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert replica["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert replica["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert replica["startupProbe"]["failureThreshold"] == 120

    docs = helm_template(
        tools,
        sets={"proxy.readinessProbe.enabled": "false", "proxy.livenessProbe.periodSeconds": "42"},
    )
    proxy = _container(one(docs, "Deployment", "-proxy"))
    assert "readinessProbe" not in proxy
    assert proxy["livenessProbe"]["periodSeconds"] == 42

    docs = helm_template(tools, values=[CI / "persistence-off-values.yaml"])
    replica = _container(one(docs, "StatefulSet"))
    assert "livenessProbe" not in replica
    assert replica["readinessProbe"] == {"tcpSocket": {"port": "metrics"}, "periodSeconds": 5}


def test_config_checksum_changes_with_config(tools: Tools) -> None:
    def checksums(sets: dict[str, str]) -> dict[str, str]:
        docs = helm_template(tools, sets=sets)
        found = {}
        for kind in ("Deployment", "StatefulSet"):
            annotations = one(docs, kind)["spec"]["template"]["metadata"]["annotations"]
            found[kind] = annotations["checksum/config"]
        assert found["Deployment"] == found["StatefulSet"]  # one ConfigMap serves both
        return found

    base = checksums({})
    assert base == checksums({}), "rendering must be deterministic"
    assert checksums({"bufferPartitions": "24"}) != base
    assert checksums({"delayService.extraConfig.forward_batch_size": "100"}) != base
    assert checksums({"proxy.podAnnotations.team": "data"}) == base


def test_secret_checksum_changes_with_credentials(tools: Tools) -> None:
    def secret_checksum(password: str) -> str:
        docs = helm_template(
            tools,
            values=[CI / "external-zookeeper-values.yaml"],
            sets={"kafka.sasl.password": password},
        )
        pod = one(docs, "StatefulSet")["spec"]["template"]["metadata"]
        return str(pod["annotations"]["checksum/secret"])

    assert secret_checksum("one") != secret_checksum("two")


def test_config_files_carry_settings_and_pod_values_come_from_env(
    tools: Tools,
) -> None:
    import yaml

    docs = helm_template(tools, values=[CI / "external-zookeeper-values.yaml"])
    data = one(docs, "ConfigMap", "-config")["data"]
    proxy = yaml.safe_load(data["proxy.yaml"])
    replica = yaml.safe_load(data["delay-service.yaml"])
    assert proxy["bootstrap_servers"].startswith("kafka-0.kafka.data.svc:9092,")
    assert proxy["advertised_host"] == "kd-kdelay-proxy.kdelay.svc.cluster.local"
    assert proxy["listen"] == "0.0.0.0:9092"
    assert proxy["http_listen"] == "0.0.0.0:8080"
    assert replica["zk_connect"].startswith("zk-0.zk.data.svc:2181,")
    assert replica["zk_root"] == "/kdelay/prod"
    # The proxy finds the replicas where they register (GET /v1/messages/{id}, /v1/pending).
    assert (proxy["zk_connect"], proxy["zk_root"]) == (replica["zk_connect"], replica["zk_root"])
    assert replica["data_dir"] == "/var/lib/kdelay"
    assert proxy["buffer_partitions"] == replica["buffer_partitions"] == 12
    env = {e["name"]: e for e in _container(one(docs, "StatefulSet"))["env"]}
    assert env["KDELAY_REPLICA_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    advertised = env["KDELAY_REPLICA_ADVERTISED_HOST"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert advertised == "status.podIP"
    secret = one(docs, "Secret", "-kafka")
    assert secret["stringData"]["sasl-username"] == "kdelay"
    mounts = {
        m["name"]: m["mountPath"] for m in _container(one(docs, "StatefulSet"))["volumeMounts"]
    }
    assert mounts["kafka-sasl"] == "/etc/kdelay/secrets/kafka"


def test_proxy_advertised_address_modes(tools: Tools) -> None:
    import yaml

    docs = helm_template(tools, values=[CI / "five-replicas-values.yaml"])
    proxy = _container(one(docs, "Deployment", "-proxy"))
    env = {e["name"]: e for e in proxy["env"]}
    assert (
        env["KDELAY_PROXY_ADVERTISED_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    )
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["proxy.yaml"])
    assert "advertised_host" not in config
    assert config["advertised_port"] == 9092
    assert "replicas" not in one(docs, "Deployment")["spec"], "the HPA owns the replica count"
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert hpa["spec"]["maxReplicas"] == 10
    assert {m["resource"]["name"] for m in hpa["spec"]["metrics"]} == {"cpu", "memory"}

    docs = helm_template(tools, values=[CI / "servicemonitor-values.yaml"])
    config = yaml.safe_load(one(docs, "ConfigMap", "-config")["data"]["proxy.yaml"])
    assert config["advertised_host"] == "kdelay.example.com"

    fixed_without_host = helm_template_text(tools, sets={"proxy.advertised.mode": "fixed"})
    assert fixed_without_host.returncode != 0
    assert "proxy.advertised.host is required" in fixed_without_host.stderr


def test_anti_affinity_soft_by_default_hard_or_off_on_request(tools: Tools) -> None:
    docs = helm_template(tools)
    affinity = one(docs, "StatefulSet")["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(affinity) == ["preferredDuringSchedulingIgnoredDuringExecution"]
    docs = helm_template(tools, values=[CI / "five-replicas-values.yaml"])
    affinity = one(docs, "StatefulSet")["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(affinity) == ["requiredDuringSchedulingIgnoredDuringExecution"]
    docs = helm_template(tools, sets={"proxy.podAntiAffinityPreset": "none"})
    assert "affinity" not in one(docs, "Deployment")["spec"]["template"]["spec"]


def test_pods_run_non_root_with_read_only_root(tools: Tools) -> None:
    docs = helm_template(tools)
    for kind in ("Deployment", "StatefulSet"):
        pod = one(docs, kind)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        container = _container(one(docs, kind))
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
        assert container["resources"]["requests"]


def test_standard_labels_everywhere(tools: Tools) -> None:
    docs = helm_template(tools, values=[CI / "servicemonitor-values.yaml"])
    for doc in docs:
        labels = doc["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "helm.sh/chart"):
            assert key in labels, f"{doc['kind']} {doc['metadata']['name']} lacks {key}"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


def test_monitoring_objects_are_gated(tools: Tools) -> None:
    default = helm_template(tools)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert not find(default, kind)
    assert not [d for d in find(default, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]

    docs = helm_template(tools, values=[CI / "servicemonitor-values.yaml"])
    monitors = find(docs, "ServiceMonitor")
    assert len(monitors) == 2
    ports = {m["metadata"]["name"]: m["spec"]["endpoints"][0]["port"] for m in monitors}
    assert ports == {"kd-kdelay-proxy": "http", "kd-kdelay-delay-service": "metrics"}
    services = find(docs, "Service")
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
        port = monitor["spec"]["endpoints"][0]["port"]
        assert any(port in {p["name"] for p in s["spec"]["ports"]} for s in matched)
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_prometheus_rule_is_rules_yml_with_runbook_base(tools: Tools) -> None:
    import yaml

    docs = helm_template(tools, values=[CI / "servicemonitor-values.yaml"])
    rule = one(docs, "PrometheusRule")
    source = yaml.safe_load((CHART / "files" / "rules.yml").read_text())
    rendered_alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    source_alerts = [r for g in source["groups"] for r in g["rules"]]
    assert [r.get("alert") or r["record"] for r in rendered_alerts] == [
        r.get("alert") or r["record"] for r in source_alerts
    ]
    assert [r["expr"] for r in rendered_alerts] == [r["expr"] for r in source_alerts]
    for r in rendered_alerts:
        if "alert" in r:
            url = r["annotations"]["runbook_url"]
            assert url.startswith("https://docs.example.com/kdelay/operations.md#"), url


def test_dashboards_rendered_as_sidecar_configmaps(tools: Tools) -> None:
    import json

    docs = helm_template(tools, values=[CI / "servicemonitor-values.yaml"])
    boards = [d for d in find(docs, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert len(boards) == len(files) == 3
    for board, path in zip(sorted(boards, key=lambda b: b["metadata"]["name"]), files, strict=True):
        assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert board["metadata"]["annotations"] == {"grafana_folder": "kdelay"}
        assert json.loads(board["data"][path.name]) == json.loads(path.read_text())


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"delayService.replicaCount": "-1"}, "replicaCount"),
        ({"proxy.replicaCount": "two"}, "replicaCount"),
        ({"delayService.persistence.size": "ten"}, "size"),
        ({"proxy.advertised.mode": "nodeIP"}, "mode"),
        ({"kafka.bootstrapServers": "no-port"}, "bootstrapServers"),
        ({"zookeeper.connect": ""}, "connect"),
        ({"bufferPartitions": "0"}, "bufferPartitions"),
        ({"delayService.podAntiAffinityPreset": "maybe"}, "podAntiAffinityPreset"),
        ({"unknownKey": "1"}, "unknownKey"),
        ({"proxy.livenessProbe.enabeld": "false"}, "enabeld"),
        ({"metrics.serviceMonitor.interval": "often"}, "interval"),
    ],
)
def test_schema_rejects_bad_values(tools: Tools, sets: dict[str, str], message: str) -> None:
    result = helm_template_text(tools, sets=sets)
    assert result.returncode != 0, f"{sets} was accepted"
    assert "schema" in result.stderr.lower()
    assert message in result.stderr


def test_schema_rejects_unknown_key_from_values_file(tools: Tools, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("delayService:\n  persistance:\n    enabled: false\n")
    result = helm_template_text(tools, values=[bad])
    assert result.returncode != 0
    assert "persistance" in result.stderr


def test_internal_topics_and_zookeeper_session_default_to_safe_values(tools: Tools) -> None:
    import yaml

    def configs(sets: dict[str, str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        data = one(helm_template(tools, sets=sets), "ConfigMap", "-config")["data"]
        return yaml.safe_load(data["proxy.yaml"]), yaml.safe_load(data["delay-service.yaml"])

    proxy, replica = configs()
    # Unset: both components on auto, replication min(3, brokers) and min ISR min(2, RF).
    for config in (proxy, replica):
        assert "buffer_replication" not in config
        assert "buffer_min_insync_replicas" not in config
    assert replica["zk_session_timeout"] == 2
    proxy, replica = configs({"bufferReplication": "5", "bufferMinInsyncReplicas": "3"})
    for config in (proxy, replica):
        assert (config["buffer_replication"], config["buffer_min_insync_replicas"]) == (5, 3)
    bad = helm_template_text(tools, sets={"bufferReplication": "0"})
    assert bad.returncode != 0
    assert "bufferReplication" in bad.stderr


def test_the_release_mode_defaults_to_exactly_once_and_is_checked(tools: Tools) -> None:
    import yaml

    def replica(sets: dict[str, str] | None = None) -> dict[str, Any]:
        data = one(helm_template(tools, sets=sets), "ConfigMap", "-config")["data"]
        return dict(yaml.safe_load(data["delay-service.yaml"]))

    assert replica()["delivery"] == "exactly-once"
    assert replica({"delayService.delivery": "at-least-once"})["delivery"] == "at-least-once"
    bad = helm_template_text(tools, sets={"delayService.delivery": "twice"})
    assert bad.returncode != 0
    assert "delivery" in bad.stderr


def test_shards_render_a_statefulset_and_a_budget_each(tools: Tools) -> None:
    """docs/operations.md, Shards: shard i of N is its own StatefulSet (`-delay-service-<i>`),
    told its shard by the environment, selecting only its pods; one budget per shard (pods
    under two budgets cannot be evicted). One shard keeps today's names and selectors."""
    docs = helm_template(tools, values=[CI / "shards-values.yaml"])
    sets = find(docs, "StatefulSet")
    assert [s["metadata"]["name"] for s in sets] == [
        f"kd-kdelay-delay-service-{i}" for i in range(3)
    ]
    budgets = [
        b for b in find(docs, "PodDisruptionBudget") if "-delay-service" in b["metadata"]["name"]
    ]
    assert len(budgets) == 3
    for i, (sts, pdb) in enumerate(zip(sets, budgets, strict=True)):
        assert sts["spec"]["replicas"] == 2
        env = {e["name"]: e.get("value") for e in _container(sts)["env"]}
        assert (env["KDELAY_REPLICA_SHARDS"], env["KDELAY_REPLICA_SHARD"]) == ("3", str(i))
        selector = sts["spec"]["selector"]["matchLabels"]
        assert selector["kdelay.io/shard"] == str(i)
        assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
        assert pdb["spec"]["selector"]["matchLabels"] == selector
        claim = sts["spec"]["volumeClaimTemplates"][0]
        assert claim["metadata"]["labels"]["kdelay.io/shard"] == str(i)
    # A release installed before `shards` existed, upgraded with --reuse-values, has no such
    # value (null drops it here): still one StatefulSet, never none (found on a real cluster).
    for single in (
        helm_template(tools),
        helm_template(tools, sets={"delayService.shards": "null"}),
    ):
        sts = one(single, "StatefulSet", "-delay-service")
        assert sts["metadata"]["name"] == "kd-kdelay-delay-service"
    sts = one(single, "StatefulSet", "-delay-service")
    assert sts["metadata"]["name"] == "kd-kdelay-delay-service"
    assert "kdelay.io/shard" not in sts["spec"]["selector"]["matchLabels"]
    assert "KDELAY_REPLICA_SHARDS" not in {e["name"] for e in _container(sts)["env"]}
