"""kdelay's image matches helm/kdelay: run as the chart runs it, each component becomes ready.

The chart is rendered with its defaults (``helm template``, Kafka and ZooKeeper pointed at the
session's containers) and each workload's container spec is applied to the image as a kubelet
would: its ``args`` after the image's own entrypoint, its environment (``fieldRef``s resolved),
its ports, its security context (``runAsUser``/``runAsGroup`` -> ``--user``,
``readOnlyRootFilesystem`` -> ``--read-only``, ``capabilities.drop`` -> ``--cap-drop``,
``allowPrivilegeEscalation: false`` -> ``no-new-privileges``) and its volumes (the ConfigMap's
files read-only at their mount path, ``emptyDir`` as a fresh volume). The readiness, liveness and
startup probes' paths must then answer 200 on the named ports.
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from dev.stack import free_port, wait_until
from tests.support.deploy_tools import Tools, find, helm_template
from tests.support.infra import ContainerSession, KafkaInfra, ZooKeeperInfra, containers, logs

RELEASE = "kd"


@pytest.fixture(scope="module")
def rendered(tools: Tools, kafka: KafkaInfra, zookeeper: ZooKeeperInfra) -> list[dict[str, Any]]:
    assert kafka.container_bootstrap
    assert zookeeper.container_connect
    return helm_template(
        tools,
        sets={
            "kafka.bootstrapServers": kafka.container_bootstrap,
            "zookeeper.connect": zookeeper.container_connect,
            "zookeeper.root": f"/kdelay/chart-{uuid.uuid4().hex[:8]}",
        },
    )


@pytest.fixture(scope="module")
def session() -> Iterator[ContainerSession]:
    with containers() as running:
        yield running


def _workload(docs: list[dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    [found] = find(docs, kind, suffix)
    return found


def _image_config(session: ContainerSession, image: str) -> dict[str, Any]:
    out = session.engine.run("image", "inspect", "--format", "{{json .Config}}", image).stdout
    config: dict[str, Any] = json.loads(out)
    return config


def test_the_image_has_the_entrypoint_user_and_ports_the_chart_expects(
    session: ContainerSession, rendered: list[dict[str, Any]]
) -> None:
    config = _image_config(session, session.image("kdelay"))
    assert config["Entrypoint"] == ["kdelay"]  # the chart gives args only
    for kind, suffix in (("Deployment", "-proxy"), ("StatefulSet", "-delay-service")):
        pod = _workload(rendered, kind, suffix)["spec"]["template"]["spec"]
        [container] = pod["containers"]
        context = container["securityContext"]
        assert config["User"] == f"{context['runAsUser']}:{context['runAsGroup']}"
        assert config["User"].split(":")[0] == str(pod["securityContext"]["runAsUser"])
        exposed = set(config["ExposedPorts"])
        for port in container["ports"]:
            assert f"{port['containerPort']}/tcp" in exposed, (suffix, port)
    data = {
        m["mountPath"]
        for m in _workload(rendered, "StatefulSet", "-delay-service")["spec"]["template"]["spec"][
            "containers"
        ][0]["volumeMounts"]
        if m["name"] == "data"
    }
    assert data == {config["WorkingDir"]}  # /var/lib/kdelay, the image's home for the user


def _env(container: dict[str, Any], pod_name: str, alias: str) -> dict[str, str]:
    """The container's environment as the kubelet would give it."""
    fields = {"metadata.name": pod_name, "status.podIP": alias}  # the alias: how peers reach it
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def _config_files(docs: list[dict[str, Any]], where: Path) -> Path:
    """The chart's ConfigMap as files, readable by the container's user (uid 10001)."""
    [configmap] = find(docs, "ConfigMap", "-config")
    where.mkdir(parents=True, exist_ok=True)
    where.chmod(0o755)
    for name, text in configmap["data"].items():
        (where / name).write_text(text)
        (where / name).chmod(0o644)
    return where


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 - our own container
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.mark.parametrize(
    ("kind", "suffix"), [("Deployment", "-proxy"), ("StatefulSet", "-delay-service")]
)
def test_each_component_runs_as_the_chart_runs_it_and_becomes_ready(
    session: ContainerSession,
    rendered: list[dict[str, Any]],
    kind: str,
    suffix: str,
    tmp_path: Path,
) -> None:
    workload = _workload(rendered, kind, suffix)
    pod = workload["spec"]["template"]["spec"]
    [spec] = pod["containers"]
    context = spec["securityContext"]
    pod_name = f"{workload['metadata']['name']}-0"
    alias = f"chart{suffix}"
    ports = {p["containerPort"]: free_port() for p in spec["ports"]}
    by_name = {p["name"]: p["containerPort"] for p in spec["ports"]}
    config_dir = _config_files(rendered, tmp_path / "config")
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts: dict[str, tuple[str, str]] = {}
    tmpfs: list[str] = []
    named: list[str] = []
    for mount in spec["volumeMounts"]:
        source = volumes.get(mount["name"], {"emptyDir": {}})  # "data": the claim, or emptyDir
        mode = "ro" if mount.get("readOnly") else "rw"
        if "configMap" in source:
            mounts[str(config_dir)] = (mount["mountPath"], mode)
        elif mount["mountPath"] == "/tmp":
            tmpfs.append("/tmp")  # an emptyDir for scratch files
        else:  # an emptyDir or a claim: a fresh volume, owned as the image's directory is
            name = f"kdelay-{uuid.uuid4().hex[:12]}-{mount['name']}"
            named.append(name)
            mounts[name] = (mount["mountPath"], mode)
    privileges = [] if context.get("allowPrivilegeEscalation", True) else ["no-new-privileges"]
    container = session.container(
        session.image("kdelay"),
        alias,
        command=spec["args"],
        env=_env(spec, pod_name, alias),
        ports=ports,
        user=f"{context['runAsUser']}:{context['runAsGroup']}",
        read_only=bool(context["readOnlyRootFilesystem"]),
        cap_drop=context["capabilities"]["drop"],
        security_opt=privileges,
        tmpfs=tuple(tmpfs),
        volumes=mounts,
    )
    with ExitStack() as cleanup:
        for name in named:
            cleanup.callback(session.engine.run, "volume", "rm", "-f", name, check=False)
        cleanup.enter_context(container)
        probes = {
            kind: spec[f"{kind}Probe"]["httpGet"]
            for kind in ("readiness", "liveness", "startup")
            if f"{kind}Probe" in spec
        }
        assert "readiness" in probes

        def url(probe: dict[str, Any]) -> str:
            return f"http://127.0.0.1:{ports[by_name[probe['port']]]}{probe['path']}"

        try:
            wait_until(
                lambda: _http_ok(url(probes["readiness"])),
                timeout=180,
                what=f"{alias}'s readiness probe {probes['readiness']['path']}",
                interval=1.0,
            )
        except Exception:
            print(logs(container, 80))
            raise
        for name, probe in probes.items():
            assert _http_ok(url(probe)), f"{name} probe {probe['path']} does not answer 200"
        # The process runs as the chart's user, without capabilities or a way to gain any, on
        # a read-only root file system. (From the host's /proc, not `exec`: an exec session's
        # conmon lingers for minutes.)
        wrapped = container.get_wrapped_container()
        wrapped.reload()
        proc = Path(f"/proc/{wrapped.attrs['State']['Pid']}/status")
        status = dict(line.split(":", 1) for line in proc.read_text().splitlines() if ":" in line)
        assert set(status["Uid"].split()) == {str(context["runAsUser"])}
        assert set(status["Gid"].split()) == {str(context["runAsGroup"])}
        if context["capabilities"]["drop"] == ["ALL"]:
            assert int(status["CapEff"], 16) == 0
            assert int(status["CapBnd"], 16) == 0
        if context.get("allowPrivilegeEscalation") is False:
            assert status["NoNewPrivs"].strip() == "1"
        assert wrapped.attrs["HostConfig"]["ReadonlyRootfs"] is context["readOnlyRootFilesystem"]
