"""`helm template` of helm/kdelay's verifier (verifier.enabled): the streaming verifier's Spark
driver in a pod, with a ServiceAccount and Role to create its executor pods, and its metrics
Service. The rendered arguments are parsed by the real ``kdelay verify`` command, so a flag the
CLI does not know fails here, not in a pod; on a secured Kafka, its environment is loaded by the
real settings.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from kdelay.verifier.cli import command
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.source import kafka_security_options
from tests.support.deploy_tools import CHART, Tools, find, helm_template, helm_template_text, one

VALUES = CHART / "ci" / "verifier-values.yaml"
SECURED = CHART / "examples" / "secured-values.yaml"
PASSWORD = "verifier-pw"  # noqa: S105 - a stand-in
CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_the_verifier_is_off_by_default(tools: Tools) -> None:
    docs = helm_template(tools)
    assert not [d for d in docs if d["metadata"]["name"].endswith("-verifier")]


def test_the_driver_pod_runs_kdelay_verify_on_kubernetes_with_two_executors(tools: Tools) -> None:
    docs = helm_template(tools, values=[VALUES])
    workload = one(docs, "StatefulSet", "-verifier")
    # One driver at a time: a StatefulSet's replacement pod waits for the old one to end.
    assert workload["spec"]["replicas"] == 1
    pod = workload["spec"]["template"]["spec"]
    container = _container(workload)
    assert container["image"] == "kdelay/kdelay-verifier:0.1.0"
    args = container["args"]
    assert args[0] == "verify"
    assert "--spark-master=k8s://https://kubernetes.default.svc" in args
    assert "--kubernetes-image=kdelay/kdelay-verifier:0.1.0" in args
    assert "--kubernetes-namespace=kdelay" in args
    assert "--executor-instances=2" in args
    assert "--topics=orders,payments" in args
    # The driver is reached at its pod's IP, and owns its executor pods by its pod's name.
    assert "--driver-host=$(KDELAY_POD_IP)" in args
    assert "--kubernetes-driver-pod=$(KDELAY_POD_NAME)" in args
    env = _env(container)
    assert env["KDELAY_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["KDELAY_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    claim_conf = "spark.kubernetes.executor.volumes.persistentVolumeClaim.checkpoint"
    assert json.loads(env["KDELAY_VERIFIER_SPARK_CONF"]) == {
        "spark.kubernetes.executor.request.cores": "250m",
        "spark.kubernetes.executor.limit.cores": "1",
        "spark.sql.warehouse.dir": "/tmp/spark-warehouse",
        # The RPC to the executors, whose tasks carry the Kafka login: authenticated, encrypted.
        "spark.authenticate": "true",
        "spark.network.crypto.enabled": "true",
        # The executors mount the checkpoint's claim where the driver has it.
        f"{claim_conf}.options.claimName": "kd-kdelay-verifier",
        f"{claim_conf}.mount.path": "/var/lib/kdelay/verifier",
        f"{claim_conf}.mount.readOnly": "false",
    }
    # Its checkpoint on the claim, its metrics on the Service.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["checkpoint"] == "/var/lib/kdelay/verifier"
    assert "--checkpoint-dir=/var/lib/kdelay/verifier/checkpoint" in args
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = one(docs, "PersistentVolumeClaim", "-verifier")
    assert claim["metadata"]["name"] == "kd-kdelay-verifier"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert volumes["checkpoint"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    service = one(docs, "Service", "-verifier")
    assert service["spec"]["ports"][0]["port"] == 9500
    assert service["spec"]["selector"] == workload["spec"]["selector"]["matchLabels"]
    # A read-only root file system; Spark writes under its working directory, an emptyDir.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["workingDir"] == "/tmp"
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_the_rendered_arguments_are_ones_kdelay_verify_accepts(tools: Tools) -> None:
    container = _container(one(helm_template(tools, values=[VALUES]), "StatefulSet", "-verifier"))
    # What the kubelet does to $(VAR) references before the container starts.
    values = {"KDELAY_POD_IP": "10.87.0.9", "KDELAY_POD_NAME": "kd-kdelay-verifier-abc"}
    args = [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in container["args"]]
    ctx = command.make_context("verify", args[1:])
    flags = {k: v for k, v in ctx.params.items() if k in VerifierConfig.model_fields}
    cfg = VerifierConfig(**{k: v for k, v in flags.items() if v is not None})
    assert (cfg.driver_host, cfg.kubernetes_driver_pod) == ("10.87.0.9", "kd-kdelay-verifier-abc")
    assert (cfg.executor_instances, cfg.kubernetes_namespace) == (2, "kdelay")
    assert cfg.spark_master == "k8s://https://kubernetes.default.svc"


def test_without_persistence_the_checkpoint_is_the_driver_pods_own(tools: Tools) -> None:
    docs = helm_template(tools, values=[VALUES], sets={"verifier.persistence.enabled": "false"})
    workload = one(docs, "StatefulSet", "-verifier")
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    assert volumes["checkpoint"] == {"name": "checkpoint", "emptyDir": {}}
    assert not find(docs, "PersistentVolumeClaim")
    conf = json.loads(_env(_container(workload))["KDELAY_VERIFIER_SPARK_CONF"])
    assert not [k for k in conf if "persistentVolumeClaim" in k]


def test_only_the_verifier_gets_an_api_token_and_only_over_its_namespace(tools: Tools) -> None:
    docs = helm_template(tools, values=[VALUES])
    workload = one(docs, "StatefulSet", "-verifier")
    pod = workload["spec"]["template"]["spec"]
    account = one(docs, "ServiceAccount", "-verifier")
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    for other in find(docs, "Deployment", "-proxy") + find(docs, "StatefulSet", "-delay-service"):
        assert other["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    role = one(docs, "Role", "-verifier")
    assert not find(docs, "ClusterRole")
    (rule,) = role["rules"]
    assert set(rule["resources"]) == {"pods", "configmaps", "persistentvolumeclaims"}
    assert {"create", "delete", "watch"} <= set(rule["verbs"])
    binding = one(docs, "RoleBinding", "-verifier")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "kdelay"}
    ]


def test_on_a_secured_kafka_the_verifier_logs_in_as_its_own_user_from_mounted_files(
    tools: Tools, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The secured example (SASL_SSL, a CA, ZooKeeper's digest user and TLS) with the verifier:
    its pod gets its own Kafka user's password and the CA as files, and no ZooKeeper setting
    (it uses none); with stand-ins at those paths, the real settings load from that
    environment, and the executors get the CA's certificates by value."""
    docs = helm_template(tools, values=[SECURED, VALUES])
    rendered = "\n".join(yaml.safe_dump(d) for d in docs)
    workload = one(docs, "StatefulSet", "-verifier")
    container = _container(workload)
    entries = container["env"]
    values = {e["name"]: e.get("value") for e in entries}
    prefix = "KDELAY_VERIFIER_"
    assert values[f"{prefix}KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert values[f"{prefix}KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    assert values[f"{prefix}KAFKA_SASL_USERNAME"] == "kdelay-verifier"
    # No ZooKeeper setting (the verifier has none: its configuration would refuse one).
    assert not [n for n in values if "_ZK_" in n]
    unknown = [
        n
        for n in values
        if n.startswith(prefix)
        and n.removeprefix(prefix).lower() not in VerifierConfig.model_fields
    ]
    assert not unknown, f"no such verifier setting: {unknown}"
    # Files from a Secret and only its own: the verifier's password, the CA.
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    for name, secret, key, path in (
        (
            "kafka-sasl",
            "kdelay-kafka-verifier",
            "password",
            values[f"{prefix}KAFKA_SASL_PASSWORD_FILE"],
        ),
        ("kafka-ca", "kafka-ca", "ca.crt", values[f"{prefix}KAFKA_SSL_CA_FILE"]),
    ):
        source = volumes[name]["secret"]
        assert source["secretName"] == secret
        assert mounts[name]["readOnly"] is True
        assert path == f"{mounts[name]['mountPath']}/{source['items'][0]['path']}"
        assert source["items"][0]["key"] == key
    secrets = {v["secret"]["secretName"] for v in volumes.values() if "secret" in v}
    assert secrets == {"kdelay-kafka-verifier", "kafka-ca"}
    # The settings load from that environment, with stand-ins at the mounted paths.
    with monkeypatch.context() as env:
        for name, value in values.items():
            if not name.startswith(prefix):
                continue
            setting = value
            if value.startswith("/etc/kdelay/"):
                stand_in = tmp_path / value.lstrip("/")
                stand_in.parent.mkdir(parents=True, exist_ok=True)
                stand_in.write_text(PASSWORD + "\n" if value.endswith("/password") else CA_PEM)
                setting = str(stand_in)
            env.setenv(name, setting)
        cfg = VerifierConfig()
    client = cfg.kafka_client_config()
    assert (client["security.protocol"], client["sasl.username"]) == ("SASL_SSL", "kdelay-verifier")
    assert client["sasl.password"] == PASSWORD
    options = kafka_security_options(cfg)
    assert options["kafka.ssl.truststore.certificates"] == CA_PEM
    assert PASSWORD not in rendered


def test_a_secured_kafka_without_the_verifiers_secret_is_refused_naming_it(tools: Tools) -> None:
    result = helm_template_text(
        tools, values=[SECURED, VALUES], sets={"kafka.sasl.verifier.existingSecret": ""}
    )
    assert result.returncode != 0
    assert "kafka.sasl.verifier.existingSecret is required" in result.stderr
    # Without the verifier, its user is not asked for.
    unused = {"kafka.sasl.verifier.existingSecret": ""}
    assert helm_template_text(tools, values=[SECURED], sets=unused).returncode == 0


def test_an_unknown_verifier_value_is_rejected_by_the_schema(tools: Tools) -> None:
    result = helm_template_text(tools, values=[VALUES], sets={"verifier.executor.instances": "3"})
    assert result.returncode != 0
    assert "executor" in result.stderr


def test_the_verifier_is_scraped_with_the_other_components(tools: Tools) -> None:
    docs = helm_template(tools, values=[VALUES], sets={"metrics.serviceMonitor.enabled": "true"})
    monitor = one(docs, "ServiceMonitor", "-verifier")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    service = one(docs, "Service", "-verifier")
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    without = helm_template(tools, sets={"metrics.serviceMonitor.enabled": "true"})
    assert len(find(without, "ServiceMonitor")) == 2
