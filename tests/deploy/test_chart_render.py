"""Assertions on `helm template` output of helm/kdelay: the properties the chart promises.

Strimzi-style unit tests, written as pytest on the rendered YAML (helm-unittest is a plugin
binary; pytest needs nothing beyond helm itself).
"""

from __future__ import annotations

import secrets
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
SECURED = CHART / "examples" / "secured-values.yaml"


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
    assert not find(docs, "Secret"), "the chart makes no Secret: passwords are referenced"
    assert env["KDELAY_REPLICA_KAFKA_SASL_USERNAME"]["value"] == "kdelay-replica"
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
        ({"kafka.securityProtocol": "SASL"}, "securityProtocol"),
        ({"kafka.sasl.mechanism": "OAUTHBEARER"}, "mechanism"),
        ({"proxy.kafkaListener.securityProtocol": "TLS"}, "securityProtocol"),
        ({"proxy.kafkaListener.saslMechanisms[0]": "GSSAPI"}, "saslMechanisms"),
        ({"proxy.httpApi.auth": "basic"}, "auth"),
        ({"networkPolicy.kafkaExtraPorts[0]": "0"}, "kafkaExtraPorts"),
        # A password is never a value (the old kafka.sasl.password is gone).
        ({"kafka.sasl.password": "x"}, "password"),
        ({"kafka.sasl.proxy.password": "x"}, "password"),
        ({"zookeeper.auth.password": "x"}, "password"),
        ({"zookeeper.auth.username": "a:b"}, "username"),
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


# ---- security: secrets by reference, listener and HTTP API, NetworkPolicy ----------

#: A password the secured tests write into the "mounted" files; no manifest may ever hold it.
PASSWORD = f"chart-test-{secrets.token_hex(8)}"
#: Environment names of the security settings (prefix + upper-case setting name).
_SECURITY_ENV = ("KAFKA_", "ZK_AUTH", "ZK_TLS", "TLS_", "LISTENER_", "SASL_", "HTTP_")


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def _file_source(workload: dict[str, Any], path: str) -> tuple[str, str, str]:
    """(volume kind, object name, key) a file in the container comes from, via its mount."""
    container = _container(workload)
    mount = next(
        m for m in container["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")
    )
    assert mount.get("readOnly") is True, f"{mount['name']} is mounted writable"
    volume = next(v for v in _pod(workload)["volumes"] if v["name"] == mount["name"])
    kind = "secret" if "secret" in volume else "configMap"
    source = volume[kind]
    name = source["secretName"] if kind == "secret" else source["name"]
    relative = path[len(mount["mountPath"].rstrip("/")) + 1 :]
    keys = [i["key"] for i in source["items"] if i["path"] == relative]
    assert len(keys) == 1, f"{path}: no item of volume {mount['name']} is {relative}"
    assert source["defaultMode"] == 0o440
    return kind, name, keys[0]


def test_default_render_has_no_security_objects_env_or_volumes(tools: Tools) -> None:
    """Security is opt-in: without it the chart renders what it did before security existed."""
    docs = helm_template(tools)
    assert not find(docs, "NetworkPolicy")
    assert not find(docs, "Secret")
    for kind, prefix in (("Deployment", "KDELAY_PROXY_"), ("StatefulSet", "KDELAY_REPLICA_")):
        workload = one(docs, kind)
        names = [e["name"] for e in _container(workload)["env"]]
        leaked = [n for n in names if n.removeprefix(prefix).startswith(_SECURITY_ENV)]
        assert not leaked, f"{kind}: {leaked}"
        assert {v["name"] for v in _pod(workload)["volumes"]} <= {"config", "tmp", "data"}
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert "scheme" not in _container(workload)[probe]["httpGet"]
    monitors = find(
        helm_template(tools, values=[CI / "servicemonitor-values.yaml"]), "ServiceMonitor"
    )
    assert all("scheme" not in m["spec"]["endpoints"][0] for m in monitors)


def test_secured_passwords_reach_pods_only_as_files_from_secrets(tools: Tools) -> None:
    """Every password is a key of an existing Secret, mounted read-only and named to the
    component by a *_PASSWORD_FILE variable: no password variable, no secretKeyRef (it would
    show in `kubectl describe`), no chart-made Secret; one Kafka user per component."""
    docs = helm_template(tools, values=[SECURED])
    assert not find(docs, "Secret")
    expected = {
        ("Deployment", "KDELAY_PROXY_"): ("kdelay-proxy", "kdelay-kafka-proxy"),
        ("StatefulSet", "KDELAY_REPLICA_"): ("kdelay-replica", "kdelay-kafka-replica"),
    }
    for (kind, prefix), (user, secret) in expected.items():
        workload = one(docs, kind)
        env = {e["name"]: e for e in _container(workload)["env"]}
        for name, entry in env.items():
            assert "secretKeyRef" not in entry.get("valueFrom", {}), name
            assert not name.endswith(("PASSWORD", "SECRET", "TOKEN")), name
        value = {n: e.get("value") for n, e in env.items()}
        assert value[f"{prefix}KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
        assert value[f"{prefix}KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
        assert value[f"{prefix}KAFKA_SASL_USERNAME"] == user
        password_file = value[f"{prefix}KAFKA_SASL_PASSWORD_FILE"]
        assert _file_source(workload, password_file) == ("secret", secret, "password")
        zk_file = value[f"{prefix}ZK_AUTH_PASSWORD_FILE"]
        assert _file_source(workload, zk_file) == ("secret", "kdelay-zookeeper", "password")
        assert value[f"{prefix}ZK_AUTH_USERNAME"] == "kdelay"
        assert value[f"{prefix}ZK_TLS"] == "true"
        for setting in ("KAFKA_SSL_CA_FILE", "ZK_TLS_CA_FILE"):
            assert _file_source(workload, value[prefix + setting]) == (
                "secret",
                "kafka-ca",
                "ca.crt",
            )
        # Each pod mounts only its own component's Kafka password.
        secrets = {v["secret"]["secretName"] for v in _pod(workload)["volumes"] if "secret" in v}
        assert secrets.isdisjoint(s for _, s in expected.values() if s != secret)
    # The ConfigMap carries no credentials either.
    config = one(docs, "ConfigMap", "-config")["data"]
    assert "password" not in config["proxy.yaml"] + config["delay-service.yaml"]
    # The replicas let only the proxy's user (and their own) WRITE the buffer topic.
    replica_env = {e["name"]: e.get("value") for e in _container(one(docs, "StatefulSet"))["env"]}
    assert replica_env["KDELAY_REPLICA_BUFFER_WRITERS"] == "User:kdelay-proxy"


def test_secured_listener_and_http_api(tools: Tools) -> None:
    docs = helm_template(tools, values=[SECURED])
    proxy = one(docs, "Deployment", "-proxy")
    container = _container(proxy)
    value = {e["name"]: e.get("value") for e in container["env"]}
    assert value["KDELAY_PROXY_LISTENER_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert _file_source(proxy, value["KDELAY_PROXY_TLS_CERT"]) == (
        "secret",
        "kdelay-proxy-tls",
        "tls.crt",
    )
    assert _file_source(proxy, value["KDELAY_PROXY_TLS_KEY"])[2] == "tls.key"
    import json

    mechanisms = json.loads(value["KDELAY_PROXY_SASL_MECHANISMS"])  # pydantic's form for a tuple
    assert mechanisms == ["SCRAM-SHA-512", "SCRAM-SHA-256", "OAUTHBEARER"]
    assert _file_source(proxy, value["KDELAY_PROXY_HTTP_TLS_CERT"])[1:] == (
        "kdelay-proxy-tls",
        "tls.crt",
    )
    assert _file_source(proxy, value["KDELAY_PROXY_HTTP_TLS_KEY"])[2] == "tls.key"
    assert (value["KDELAY_PROXY_HTTP_AUTH"], value["KDELAY_PROXY_HTTP_SASL_MECHANISM"]) == (
        "kafka",
        "SCRAM-SHA-512",
    )
    jwks = value["KDELAY_PROXY_HTTP_JWKS_FILE"]
    assert _file_source(proxy, jwks) == ("configMap", "kdelay-jwks", "jwks.json")
    # HTTPS: the probes and the proxy's ServiceMonitor follow; the replicas' stay on HTTP.
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["scheme"] == "HTTPS"
    replica_names = {e["name"] for e in _container(one(docs, "StatefulSet"))["env"]}
    assert not {n for n in replica_names if n.startswith(("KDELAY_REPLICA_HTTP", "KDELAY_PROXY"))}
    endpoints = {
        m["metadata"]["name"]: m["spec"]["endpoints"][0] for m in find(docs, "ServiceMonitor")
    }
    assert endpoints["kd-kdelay-proxy"]["scheme"] == "https"
    assert endpoints["kd-kdelay-proxy"]["tlsConfig"]["ca"]["secret"]["name"] == "kdelay-proxy-tls"
    assert "scheme" not in endpoints["kd-kdelay-delay-service"]


def test_secured_settings_are_what_the_components_load(
    tools: Tools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rendered environment and config files, with the mounted files stood in for under
    tmp_path, build the proxy's and the replica's real settings: the variable names are the
    components' own, and the password reaches librdkafka and ZooKeeper from its file only."""
    import yaml

    from kdelay.config_loader import load
    from kdelay.delay_service.config import ReplicaConfig
    from kdelay.proxy.config import ProxyConfig

    docs = helm_template(tools, values=[SECURED])
    rendered = "\n".join(yaml.safe_dump(d) for d in docs)
    data = one(docs, "ConfigMap", "-config")["data"]
    for kind, cls, config_name in (
        ("Deployment", ProxyConfig, "proxy.yaml"),
        ("StatefulSet", ReplicaConfig, "delay-service.yaml"),
    ):
        prefix = str(cls.model_config.get("env_prefix"))
        names = [e["name"] for e in _container(one(docs, kind))["env"]]
        unknown = [
            n
            for n in names
            if n != "PYTHONDONTWRITEBYTECODE"
            and n.removeprefix(prefix).lower() not in cls.model_fields
        ]
        assert not unknown, f"{kind}: no such setting: {unknown}"
        with monkeypatch.context() as env:
            for entry in _container(one(docs, kind))["env"]:
                value = entry.get("value")
                if value is None:
                    continue  # the downward API's pod name and IP
                if value.startswith("/etc/kdelay/"):
                    stand_in = tmp_path / value.lstrip("/")
                    stand_in.parent.mkdir(parents=True, exist_ok=True)
                    secret = PASSWORD if value.endswith("/password") else "{}"
                    stand_in.write_text(secret + "\n")
                    value = str(stand_in)
                env.setenv(entry["name"], value)
            config_file = tmp_path / config_name
            config_file.write_text(data[config_name])
            cfg = load(cls, config_file=config_file)
        assert isinstance(cfg, ProxyConfig | ReplicaConfig)
        client = cfg.kafka_client_config()
        assert client["security.protocol"] == "SASL_SSL"
        assert client["sasl.password"] == PASSWORD
        assert client["ssl.ca.location"].endswith("/etc/kdelay/tls/kafka-ca/ca.crt")
        assert cfg.zk_password() == PASSWORD
        assert cfg.zk_tls is True
        if isinstance(cfg, ProxyConfig):
            assert cfg.listener_protocol == "SASL_SSL"
            assert cfg.sasl_mechanisms == ("SCRAM-SHA-512", "SCRAM-SHA-256", "OAUTHBEARER")
            assert cfg.tls_cert is not None
            assert str(cfg.tls_cert).endswith("/etc/kdelay/tls/listener/tls.crt")
            assert (cfg.http_auth, cfg.http_sasl_mechanism) == ("kafka", "SCRAM-SHA-512")
            assert cfg.http_tls_cert is not None
            assert str(cfg.http_tls_cert).endswith("/etc/kdelay/tls/http/tls.crt")
            assert cfg.http_jwks_file is not None
            assert cfg.http_jwks_file.name == "jwks.json"
    assert PASSWORD not in rendered


#: A SASL Kafka with the proxy's and the replicas' users in place.
_SASL_KAFKA = {
    "kafka.securityProtocol": "SASL_PLAINTEXT",
    "kafka.sasl.proxy.existingSecret": "p",
    "kafka.sasl.delayService.existingSecret": "r",
}


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            {"kafka.securityProtocol": "SASL_SSL"},
            "kafka.sasl.proxy.existingSecret is required when kafka.securityProtocol is SASL_SSL",
        ),
        (
            {
                "kafka.securityProtocol": "SASL_PLAINTEXT",
                "kafka.sasl.proxy.existingSecret": "p",
                "kafka.sasl.delayService.username": "",
                "proxy.kafkaListener.allowUnauthenticated": "true",
            },
            "kafka.sasl.delayService.username is required",
        ),
        (
            {
                "kafka.tls.ca.existingSecret": "a",
                "kafka.tls.ca.existingConfigMap": "b",
                "kafka.securityProtocol": "SSL",
            },
            "kafka.tls.ca: set existingSecret or existingConfigMap, not both",
        ),
        (
            {"proxy.kafkaListener.securityProtocol": "SSL"},
            "proxy.kafkaListener.tls.existingSecret is required",
        ),
        (
            {"proxy.kafkaListener.securityProtocol": "SASL_PLAINTEXT"},
            "kafka.securityProtocol must be SASL_SSL or SASL_PLAINTEXT",
        ),
        ({"proxy.kafkaListener.tls.existingSecret": "t"}, "securityProtocol is PLAINTEXT"),
        ({"proxy.httpApi.auth": "kafka"}, "set proxy.httpApi.tls.existingSecret"),
        ({"proxy.httpApi.jwks.existingConfigMap": "j"}, "needs proxy.httpApi.auth=kafka"),
        ({"zookeeper.auth.username": "kdelay"}, "zookeeper.auth.existingSecret is required"),
        ({"zookeeper.auth.existingSecret": "z"}, "without zookeeper.auth.username"),
        ({"zookeeper.tls.ca.existingSecret": "c"}, "zookeeper.tls.enabled is false"),
        # Secure by default: no open door beside a locked one.
        (_SASL_KAFKA, "proxy.kafkaListener.allowUnauthenticated=true"),
        (
            {**_SASL_KAFKA, "proxy.kafkaListener.securityProtocol": "SASL_PLAINTEXT"},
            "proxy.httpApi.allowUnauthenticated=true",
        ),
    ],
)
def test_incomplete_security_fails_naming_the_value(
    tools: Tools, sets: dict[str, str], message: str
) -> None:
    result = helm_template_text(tools, sets=sets)
    assert result.returncode != 0, f"{sets} was accepted"
    assert message in result.stderr, result.stderr


def test_http_auth_without_tls_only_when_plaintext_auth_is_allowed(tools: Tools) -> None:
    docs = helm_template(
        tools,
        sets={"proxy.httpApi.auth": "kafka", "proxy.extraConfig.http_allow_plaintext_auth": "true"},
    )
    env = {e["name"]: e.get("value") for e in _container(one(docs, "Deployment"))["env"]}
    assert env["KDELAY_PROXY_HTTP_AUTH"] == "kafka"
    assert "KDELAY_PROXY_HTTP_TLS_CERT" not in env


def test_open_doors_beside_a_sasl_kafka_render_only_when_opted_in(tools: Tools) -> None:
    """Each opt-in reaches the proxy as its setting, and the proxy accepts the result."""
    from kdelay.proxy import ProxyConfig

    sasl_listener = {**_SASL_KAFKA, "proxy.kafkaListener.securityProtocol": "SASL_PLAINTEXT"}
    for sets, name in (
        ({**_SASL_KAFKA, "proxy.kafkaListener.allowUnauthenticated": "true"}, "LISTENER"),
        ({**sasl_listener, "proxy.httpApi.allowUnauthenticated": "true"}, "HTTP"),
    ):
        docs = helm_template(tools, sets=sets)
        env = {e["name"]: e.get("value") for e in _container(one(docs, "Deployment"))["env"]}
        assert env[f"KDELAY_PROXY_{name}_ALLOW_UNAUTHENTICATED"] == "true"
        settings = {
            "listener_security_protocol": env.get("KDELAY_PROXY_LISTENER_SECURITY_PROTOCOL"),
            "kafka_security_protocol": env["KDELAY_PROXY_KAFKA_SECURITY_PROTOCOL"],
            "kafka_sasl_username": "kdelay-proxy",
            "kafka_sasl_password": PASSWORD,
            f"{name.lower()}_allow_unauthenticated": True,
        }
        assert ProxyConfig(**{k: v for k, v in settings.items() if v is not None})
    default = {e["name"] for e in _container(one(helm_template(tools), "Deployment"))["env"]}
    assert not {n for n in default if n.endswith("ALLOW_UNAUTHENTICATED")}


def _policy_ports(rule: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p["protocol"], p["port"]) for p in rule["ports"]}


def test_network_policies_open_the_proxy_and_close_the_replicas(tools: Tools) -> None:
    docs = helm_template(tools, values=[SECURED])
    proxy_pods = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    replica_pods = one(docs, "StatefulSet")["spec"]["template"]["metadata"]["labels"]
    proxy_np = one(docs, "NetworkPolicy", "-proxy")["spec"]
    replica_np = one(docs, "NetworkPolicy", "-delay-service")["spec"]
    # Each policy selects its component's pods and no other.
    assert proxy_np["podSelector"]["matchLabels"].items() <= proxy_pods.items()
    assert not proxy_np["podSelector"]["matchLabels"].items() <= replica_pods.items()
    assert replica_np["podSelector"]["matchLabels"].items() <= replica_pods.items()
    assert not replica_np["podSelector"]["matchLabels"].items() <= proxy_pods.items()
    monitoring = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
    }
    # The proxy: Kafka and HTTP from the labelled clients and the producer namespaces only.
    clients, scrape = proxy_np["ingress"]
    assert _policy_ports(clients) == {("TCP", 9092), ("TCP", 8080)}
    assert clients["from"] == [
        {"podSelector": {"matchLabels": {"kd-kdelay-client": "true"}}},
        {"namespaceSelector": {"matchLabels": {"kdelay-access": "producer"}}},
    ]
    assert _policy_ports(scrape) == {("TCP", 8080)}
    assert scrape["from"] == [monitoring]
    # The replicas: their metrics (and query) port from the proxy pods, the replicas (kdelay
    # status --id in a replica pod) and monitoring only.
    (only,) = replica_np["ingress"]
    assert _policy_ports(only) == {("TCP", 9400)}
    proxy_peer, replica_peer, monitoring_peer = only["from"]
    assert proxy_peer["podSelector"]["matchLabels"].items() <= proxy_pods.items()
    assert replica_peer["podSelector"]["matchLabels"] == replica_np["podSelector"]["matchLabels"]
    assert "namespaceSelector" not in proxy_peer
    assert "namespaceSelector" not in replica_peer
    assert monitoring_peer == monitoring
    # Egress: DNS, Kafka's and ZooKeeper's ports from the connect strings, and (proxy) replicas.
    for policy in (proxy_np, replica_np):
        assert policy["policyTypes"] == ["Ingress", "Egress"]
        ports = [_policy_ports(rule) for rule in policy["egress"]]
        assert ports[:3] == [{("UDP", 53), ("TCP", 53)}, {("TCP", 9093)}, {("TCP", 2281)}]
        assert all("to" not in rule for rule in policy["egress"][:3])
    for policy in (proxy_np, replica_np):
        (to_replicas,) = policy["egress"][3:]
        assert _policy_ports(to_replicas) == {("TCP", 9400)}
        matched = to_replicas["to"][0]["podSelector"]["matchLabels"]
        assert matched.items() <= replica_pods.items()


def test_network_policy_defaults_allow_every_client_and_all_egress(tools: Tools) -> None:
    docs = helm_template(
        tools,
        sets={
            "networkPolicy.enabled": "true",
            "networkPolicy.kafkaEgressTo[0].ipBlock.cidr": "10.1.0.0/16",
        },
    )
    proxy_np = one(docs, "NetworkPolicy", "-proxy")["spec"]
    assert proxy_np["policyTypes"] == ["Ingress"]
    assert "egress" not in proxy_np
    (clients,) = proxy_np["ingress"]
    assert "from" not in clients, "allowExternal: any client reaches the Kafka and HTTP ports"
    replica_np = one(docs, "NetworkPolicy", "-delay-service")["spec"]
    (only,) = replica_np["ingress"]
    assert len(only["from"]) == 2, "no monitoring selector: only the proxy pods and replicas"
    # Egress limited, Kafka where told, extra ports and rules kept.
    docs = helm_template(
        tools,
        sets={
            "networkPolicy.enabled": "true",
            "networkPolicy.allowExternalEgress": "false",
            "networkPolicy.kafkaEgressTo[0].ipBlock.cidr": "10.1.0.0/16",
            "networkPolicy.kafkaExtraPorts[0]": "9094",
            "networkPolicy.extraEgress[0].ports[0].port": "443",
        },
    )
    egress = one(docs, "NetworkPolicy", "-delay-service")["spec"]["egress"]
    assert egress[1]["to"] == [{"ipBlock": {"cidr": "10.1.0.0/16"}}]
    assert _policy_ports(egress[1]) == {("TCP", 9092), ("TCP", 9094)}
    assert egress[-1] == {"ports": [{"port": 443}]}
