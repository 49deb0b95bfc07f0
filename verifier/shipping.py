"""What a Spark cluster's executors need from this machine, and the settings per master kind.

``kdelay verify --spark-master URL`` runs on ``local[N]``, a standalone cluster
(``spark://host:port``) or Kubernetes (``k8s://https://host:port``). The job ships everything
its executors need itself, from the machine only (nothing is fetched from the internet):

- the project's Python package ``kdelay`` without the proxy, the replicas and ZooKeeper: a
  zip built at start into a temporary directory (:func:`package_zip`), added with
  ``SparkContext.addPyFile`` so every executor's Python worker can import it;
- the pinned spark-sql-kafka jars (``kdelay.jars.jar_dir("spark-kafka")``), passed as
  ``spark.jars``: the driver serves them to the executors from its own file server.

Executors run ``spark.pyspark.python`` = this interpreter (the same path on every machine of
a cluster, as in a container image), ``spark.executor.memory`` / ``spark.executor.cores`` from
the configuration. On Kubernetes the executors' image is ``--kubernetes-image`` (no default:
a ``k8s://`` master without one is a ConfigError naming the setting), in the image
``deploy/docker/verifier-entrypoint.sh`` turns into an executor; ``--executor-instances`` of
them, in ``--kubernetes-namespace``, owned by the driver's pod when ``--kubernetes-driver-pod``
names it (the driver then runs in that pod, Spark's client mode, and ``--driver-host`` is the
pod's IP). The driver listens on ``--driver-host`` only (127.0.0.1 by default).

No Spark import here: the settings are plain data, unit-tested without a JVM.

Threading: :func:`package_zip` builds one zip per process (guarded by a lock) and removes it
at interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kdelay.errors import ConfigError

#: The package executors import, and the components of it they never use.
SHIPPED_PACKAGES = ("kdelay",)
NOT_SHIPPED = ("kdelay.proxy", "kdelay.delay_service", "kdelay.zk")
LOCAL = "local"
STANDALONE = "standalone"
KUBERNETES = "kubernetes"

_lock = threading.Lock()
_zip: Path | None = None


def master_kind(master: str) -> str:
    """``local``, ``standalone`` or ``kubernetes`` for a Spark master URL (else ConfigError)."""
    if master == "local" or master.startswith("local["):
        return LOCAL
    if master.startswith("spark://") and len(master) > len("spark://"):
        return STANDALONE
    if master.startswith("k8s://") and len(master) > len("k8s://"):
        return KUBERNETES
    raise ConfigError(
        f"--spark-master {master!r} is not a Spark master this verifier supports: use local[N], "
        "spark://host:port (standalone) or k8s://https://host:port (Kubernetes)"
    )


@dataclass(frozen=True)
class Executors:
    """Where and how big the executors are (the verifier's settings of the same names)."""

    memory: str = "1g"
    cores: int = 1
    instances: int = 2
    kubernetes_image: str = ""
    kubernetes_namespace: str = "default"
    kubernetes_driver_pod: str = ""


def cluster_settings(
    master: str, executors: Executors, *, python: str | None = None
) -> dict[str, str]:
    """The Spark settings for running executors on ``master`` (besides the common ones)."""
    kind = master_kind(master)
    settings = {"spark.pyspark.python": python or sys.executable}
    if kind == LOCAL:
        return settings
    settings["spark.executor.memory"] = executors.memory
    settings["spark.executor.cores"] = str(executors.cores)
    if kind == KUBERNETES:
        if not executors.kubernetes_image:
            raise ConfigError(
                f"--spark-master {master} runs executors on Kubernetes, which needs their "
                "container image: set --kubernetes-image (KDELAY_VERIFIER_KUBERNETES_IMAGE), "
                "e.g. the project's verifier image"
            )
        settings["spark.kubernetes.container.image"] = executors.kubernetes_image
        settings["spark.executor.instances"] = str(executors.instances)
        settings["spark.kubernetes.namespace"] = executors.kubernetes_namespace
        if executors.kubernetes_driver_pod:
            settings["spark.kubernetes.driver.pod.name"] = executors.kubernetes_driver_pod
    return settings


def package_zip() -> Path:
    """A zip of :data:`SHIPPED_PACKAGES` (their ``.py`` files), built once per process into a
    temporary directory removed at exit."""
    global _zip  # noqa: PLW0603 - one zip per process
    with _lock:
        if _zip is not None and _zip.exists():
            return _zip
        tmp = Path(tempfile.mkdtemp(prefix="kdelay-verifier-py-"))
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        target = tmp / "kdelay-packages.zip"
        write_package_zip(target)
        _zip = target
        return target


def write_package_zip(target: Path, packages: tuple[str, ...] = SHIPPED_PACKAGES) -> None:
    """Write the ``.py`` files of ``packages`` (imported from where this process imports them)
    into ``target``, at their import paths, leaving out :data:`NOT_SHIPPED`. In a checkout the
    components are symbolic links inside ``kdelay/`` (the wheel holds them as folders): they are
    followed."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in packages:
            module = __import__(name)
            root = Path(str(module.__file__)).parent
            for folder, dirs, files in os.walk(root, followlinks=True):
                rel = Path(folder).relative_to(root)
                dotted = ".".join((name, *rel.parts))
                if "__pycache__" in rel.parts or dotted in NOT_SHIPPED:
                    dirs.clear()
                    continue
                dirs.sort()
                for file in sorted(f for f in files if f.endswith(".py")):
                    zf.write(Path(folder) / file, f"{name}/{(rel / file).as_posix()}")
