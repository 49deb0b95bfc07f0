"""deploy/docker/verifier-entrypoint.sh, the verifier image's entrypoint, run with a stand-in
``java`` and ``kdelay`` that print their arguments: ``executor`` (what Spark on Kubernetes passes
an executor pod) becomes Spark's KubernetesExecutorBackend with the settings Spark put in the
environment; anything else is ``kdelay`` with the same arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ENTRYPOINT = Path(__file__).resolve().parents[2] / "deploy" / "docker" / "verifier-entrypoint.sh"
EXECUTOR_ENV = {
    "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.87.0.9:7078",
    "SPARK_EXECUTOR_ID": "2",
    "SPARK_EXECUTOR_CORES": "1",
    "SPARK_EXECUTOR_MEMORY": "512m",
    "SPARK_APPLICATION_ID": "spark-app-1",
    "SPARK_EXECUTOR_POD_IP": "10.87.0.12",
    "SPARK_EXECUTOR_POD_NAME": "kdelay-verifier-abc-exec-2",
    "SPARK_RESOURCE_PROFILE_ID": "0",
    # Numeric order, not the environment's: 10 comes after 2. An option may hold spaces.
    "SPARK_JAVA_OPT_10": "-Dspark.driver.port=7078",
    "SPARK_JAVA_OPT_2": "-Dspark.app.name=kdelay verifier",
    "SPARK_JAVA_OPT_0": "-Dspark.executor.id=2",
}


def _stand_in(directory: Path, name: str) -> None:
    script = directory / name
    script.write_text(f'#!/bin/sh\nfor a in "$@"; do echo "{name}> $a"; done\n')
    script.chmod(0o755)


def _run(tmp_path: Path, *args: str, env: dict[str, str]) -> list[str]:
    java_home = tmp_path / "jdk"
    (java_home / "bin").mkdir(parents=True)
    _stand_in(java_home / "bin", "java")
    _stand_in(tmp_path, "kdelay")
    path = f"{tmp_path}:{Path(sys.executable).parent}:{os.environ['PATH']}"
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), *args],
        env={"PATH": path, "JAVA_HOME": str(java_home), **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_anything_but_executor_is_kdelay(tmp_path: Path) -> None:
    assert _run(tmp_path, "verify", "--help", env={}) == ["kdelay> verify", "kdelay> --help"]


def test_executor_starts_sparks_kubernetes_executor_backend(tmp_path: Path) -> None:
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    argv = [line.removeprefix("java> ") for line in _run(tmp_path, "executor", env=EXECUTOR_ENV)]
    assert argv[:3] == [
        "-Dspark.executor.id=2",
        "-Dspark.app.name=kdelay verifier",
        "-Dspark.driver.port=7078",
    ]
    assert argv[3:7] == ["-Xms512m", "-Xmx512m", "-cp", f"{spark_home}/jars/*"]
    assert argv[7] == "org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend"
    flags = dict(zip(argv[8::2], argv[9::2], strict=True))
    assert flags == {
        "--driver-url": EXECUTOR_ENV["SPARK_DRIVER_URL"],
        "--executor-id": "2",
        "--cores": "1",
        "--app-id": "spark-app-1",
        "--hostname": "10.87.0.12",
        "--resourceProfileId": "0",
        "--podName": "kdelay-verifier-abc-exec-2",
    }
    # The backend's class is in pyspark's jars: the executor needs no Spark distribution.
    assert list(spark_home.glob("jars/spark-kubernetes_*.jar"))


def test_an_executor_without_sparks_settings_fails_naming_the_missing_one(tmp_path: Path) -> None:
    env = {k: v for k, v in EXECUTOR_ENV.items() if k != "SPARK_DRIVER_URL"}
    with pytest.raises(AssertionError, match="SPARK_DRIVER_URL"):
        _run(tmp_path, "executor", env=env)
