"""`helm template` of helm/kdelay's verifier (verifier.enabled): the streaming verifier's Spark
driver in a pod, with a ServiceAccount and Role to create its executor pods, and its metrics
Service. The rendered arguments are parsed by the real ``kdelay verify`` command, so a flag the
CLI does not know fails here, not in a pod.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tests.support.deploy_tools import CHART, Tools, find, helm_template, helm_template_text, one
from verifier.cli import command
from verifier.config import VerifierConfig

VALUES = CHART / "ci" / "verifier-values.yaml"


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


def test_a_secured_kafka_with_the_verifier_is_refused_naming_the_setting(tools: Tools) -> None:
    result = helm_template_text(
        tools,
        values=[VALUES],
        sets={"kafka.securityProtocol": "SASL_SSL"},
    )
    assert result.returncode != 0
    assert "verifier.enabled" in result.stderr
    assert "kafka.securityProtocol is SASL_SSL" in result.stderr


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
