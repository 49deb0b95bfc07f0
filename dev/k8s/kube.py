"""kubectl against the development cluster, and the objects ``k8s-up`` puts in it.

Storage: no provisioner; a default StorageClass (``kdelay-local``, bound on first use) and
hostPath PersistentVolumes under ``.kdelay/k8s/volumes``, owned by the chart's user (10001) since
fsGroup does not apply to hostPath. Released volumes are recycled by ``k8s-up``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from dev.k8s.settings import NODE_NAME, Layout
from kdelay.errors import InfrastructureError

PERSISTENT_VOLUMES = 8
_VOLUME_SIZE = "10Gi"
_CHART_UID = 10001


def kubectl(layout: Layout, *args: str, check: bool = True, stdin: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """``kubectl ARGS`` with the cluster's admin kubeconfig."""
    argv = [str(layout.bin("kubectl")), f"--kubeconfig={layout.kubeconfig}", *args]
    result = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, check=False, timeout=timeout
    )
    if check and result.returncode != 0:
        raise InfrastructureError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def get_json(layout: Layout, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(kubectl(layout, "get", "-o", "json", *args).stdout)
    return out


def node_ready(layout: Layout) -> bool:
    result = kubectl(layout, "get", "node", NODE_NAME, "-o", "json", check=False, timeout=10)
    if result.returncode != 0:
        return False
    conditions = json.loads(result.stdout)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait(condition: Any, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise InfrastructureError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


#: A hostPath on the one node is shareable by every pod (the verifier's checkpoint is mounted by
#: its driver and its executors).
ACCESS_MODES = ["ReadWriteOnce", "ReadWriteMany"]


def _volume(layout: Layout, index: int) -> str:
    path = layout.volumes / f"pv-{index}"
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"kdelay-pv-{index}", "labels": {"kdelay.dev/local": "true"}},
            "spec": {
                "capacity": {"storage": _VOLUME_SIZE},
                "accessModes": ACCESS_MODES,
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "kdelay-local",
                "hostPath": {"path": str(path), "type": "DirectoryOrCreate"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": [NODE_NAME],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        }
    )


def ensure_storage(layout: Layout) -> str:
    """The default StorageClass and the hostPath volumes; released ones are emptied for reuse."""
    kubectl(layout, "apply", "-f", str(layout.deploy / "storage.yaml"))
    existing = get_json(layout, "pv", "-l", "kdelay.dev/local=true")["items"]
    phases = {pv["metadata"]["name"]: pv["status"].get("phase", "") for pv in existing}
    for pv in existing:  # made by an earlier version with ReadWriteOnce only
        if pv["spec"].get("accessModes") != ACCESS_MODES and phases[pv["metadata"]["name"]] == (
            "Available"
        ):
            patch = json.dumps({"spec": {"accessModes": ACCESS_MODES}})
            kubectl(layout, "patch", "pv", pv["metadata"]["name"], "-p", patch)
    created = recycled = 0
    for index in range(PERSISTENT_VOLUMES):
        name = f"kdelay-pv-{index}"
        path = layout.volumes / f"pv-{index}"
        if phases.get(name) == "Released":
            kubectl(layout, "delete", "pv", name, "--wait=true")
            subprocess.run(["rm", "-rf", str(path)], check=True)
            recycled += 1
        elif name in phases:
            continue
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, _CHART_UID, _CHART_UID)
        kubectl(layout, "apply", "-f", "-", stdin=_volume(layout, index))
        created += 1
    return f"{PERSISTENT_VOLUMES} volumes ({created} created, {recycled} recycled)"
