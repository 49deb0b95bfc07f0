"""The project's images in the node's containerd, as a registry would have delivered them.

Nothing is pulled: the chart's ``imagePullPolicy: IfNotPresent`` finds the images ``make
containers`` built (Podman's project storage), exported with ``podman save`` and imported with
``ctr -n k8s.io images import`` under the names a kubelet asks for (``kdelay/kdelay:0.1.0`` is
``docker.io/kdelay/kdelay:0.1.0`` to containerd). The pod sandbox ("pause") image is built here
from Debian's static busybox. An image is imported again only when its Podman id changed
(``.kdelay/k8s/containerd/imported.json``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from dev.containers.engine import podman_env
from dev.containers.images import catalogue
from dev.k8s.settings import PAUSE_IMAGE, Layout
from kdelay.errors import InfrastructureError

#: The images the chart's tests run: kdelay itself, its verifier (Spark driver and executors),
#: Kafka and ZooKeeper.
WANTED = ("kdelay", "verifier", "kafka", "zookeeper")


def _podman(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, **podman_env()}
    return subprocess.run(["podman", *args], input=stdin, env=env, capture_output=True, check=False)


def _ctr(layout: Layout, *args: str) -> list[str]:
    return ["ctr", "--address", str(layout.socket), "-n", "k8s.io", *args]


def normalized(name: str) -> str:
    """The name containerd (and so the kubelet) uses for a Docker-style reference."""
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    if "." in first or ":" in first or first == "localhost":
        return name
    return f"docker.io/{name}"


def _podman_id(name: str) -> str | None:
    result = _podman("image", "inspect", "--format", "{{.Id}}", name)
    return result.stdout.decode().strip() or None if result.returncode == 0 else None


def _build_pause() -> None:
    """``kdelay.local/pause:1``: a static busybox that sleeps, as the sandbox's init."""
    busybox = Path("/bin/busybox")
    with tempfile.TemporaryDirectory(prefix="kdelay-pause-") as tmp:
        root = Path(tmp)
        (root / "bin").mkdir()
        shutil.copy2(busybox, root / "bin" / "busybox")
        tar = subprocess.run(["tar", "-C", str(root), "-c", "."], capture_output=True, check=True)
        result = _podman(
            "import",
            "--change",
            'ENTRYPOINT ["/bin/busybox", "sleep", "2147483647"]',
            "-",
            PAUSE_IMAGE,
            stdin=tar.stdout,
        )
        if result.returncode != 0:
            raise InfrastructureError(f"podman import of the pause image: {result.stderr.decode()}")


def load(layout: Layout) -> list[str]:
    """Import every wanted image that containerd lacks or has in an older build; what was done."""
    record_path = layout.state / "containerd" / "imported.json"
    record: dict[str, str] = json.loads(record_path.read_text()) if record_path.exists() else {}
    listed = subprocess.run(
        _ctr(layout, "images", "ls", "-q"), capture_output=True, text=True, check=False
    ).stdout.split()
    if _podman_id(PAUSE_IMAGE) is None:
        _build_pause()
    names = [PAUSE_IMAGE] + [catalogue()[key].name for key in WANTED]
    done = []
    for name in names:
        image_id = _podman_id(name)
        if image_id is None:
            raise InfrastructureError(
                f"image {name} is not in the project's Podman storage: run `make containers`"
            )
        target = normalized(name)
        if record.get(target) == image_id and target in listed:
            done.append(f"{name} present")
            continue
        save = subprocess.Popen(
            ["podman", "save", "--format", "docker-archive", name],
            env={**os.environ, **podman_env()},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        imported = subprocess.run(
            _ctr(layout, "images", "import", "--all-platforms", "-"),
            stdin=save.stdout,
            capture_output=True,
            text=True,
            check=False,
        )
        assert save.stdout is not None
        save.stdout.close()
        save_err = save.stderr.read().decode() if save.stderr else ""
        if save.wait() != 0 or imported.returncode != 0:
            raise InfrastructureError(
                f"loading {name} into containerd failed: {save_err}{imported.stderr}"
            )
        # podman saves "localhost/<name>" for an unqualified local name: tag what pods ask for.
        saved = [line.split()[1] for line in imported.stdout.splitlines() if "unpacking" in line]
        source = next((s.split("@")[0] for s in saved), f"localhost/{name}")
        if source != target:
            tag = _ctr(layout, "images", "tag", "--force", source, target)
            subprocess.run(tag, capture_output=True, check=True)
        record[target] = image_id
        record_path.write_text(json.dumps(record, indent=1))
        done.append(f"{name} imported")
    return done
