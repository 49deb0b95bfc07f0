"""What ``kdelay verify`` ships to a Spark cluster's executors, per master kind (no Spark)."""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdelay.errors import ConfigError
from kdelay.verifier import shipping
from kdelay.verifier.config import VerifierConfig

SIZES = shipping.Executors(memory="2g", cores=3, instances=4)


@pytest.mark.parametrize(
    ("master", "kind"),
    [
        ("local", shipping.LOCAL),
        ("local[2]", shipping.LOCAL),
        ("spark://127.0.0.1:7077", shipping.STANDALONE),
        ("k8s://https://127.0.0.1:6443", shipping.KUBERNETES),
    ],
)
def test_master_kinds(master: str, kind: str) -> None:
    assert shipping.master_kind(master) == kind


@pytest.mark.parametrize("master", ["yarn", "spark://", "mesos://h:5050", ""])
def test_an_unsupported_master_is_a_config_error_naming_the_option(master: str) -> None:
    with pytest.raises(ConfigError, match="--spark-master"):
        shipping.master_kind(master)


def test_local_runs_executors_on_this_interpreter_and_sets_no_executor_sizes() -> None:
    assert shipping.cluster_settings("local[2]", SIZES) == {"spark.pyspark.python": sys.executable}


def test_standalone_sets_executor_python_memory_and_cores() -> None:
    assert shipping.cluster_settings("spark://127.0.0.1:7077", SIZES) == {
        "spark.pyspark.python": sys.executable,
        "spark.executor.memory": "2g",
        "spark.executor.cores": "3",
    }


def test_kubernetes_needs_an_image_and_the_error_names_the_setting() -> None:
    with pytest.raises(ConfigError, match="--kubernetes-image"):
        shipping.cluster_settings("k8s://https://127.0.0.1:6443", SIZES)
    got = shipping.cluster_settings(
        "k8s://https://127.0.0.1:6443",
        shipping.Executors(kubernetes_image="kdelay-verifier:dev", kubernetes_namespace="v"),
    )
    assert got == {
        "spark.pyspark.python": sys.executable,
        "spark.executor.memory": "1g",
        "spark.executor.cores": "1",
        "spark.kubernetes.container.image": "kdelay-verifier:dev",
        "spark.executor.instances": "2",
        "spark.kubernetes.namespace": "v",
    }


def test_a_driver_in_a_pod_owns_its_executor_pods() -> None:
    got = shipping.cluster_settings(
        "k8s://https://kubernetes.default.svc",
        shipping.Executors(instances=3, kubernetes_image="i", kubernetes_driver_pod="verifier-0"),
    )
    assert got["spark.kubernetes.driver.pod.name"] == "verifier-0"
    assert got["spark.executor.instances"] == "3"


def test_the_package_zip_holds_kdelay_and_its_verifier_at_their_import_paths(
    tmp_path: Path,
) -> None:
    target = tmp_path / "p.zip"
    shipping.write_package_zip(target)
    names = set(zipfile.ZipFile(target).namelist())
    assert {"kdelay/__init__.py", "kdelay/buffer/__init__.py", "kdelay/verifier/job.py"} <= names
    components = ("kdelay/proxy/", "kdelay/delay_service/", "kdelay/zk/")
    assert not any(n.startswith(components) for n in names)
    assert not any("__pycache__" in n or not n.endswith(".py") for n in names)
    # The process-wide zip (what spark_session ships) is built once and exists.
    assert zipfile.is_zipfile(shipping.package_zip())


def test_executor_settings_are_configuration_fields_and_cli_options() -> None:
    cfg = VerifierConfig()
    assert (cfg.executor_memory, cfg.executor_cores, cfg.kubernetes_image) == ("1g", 1, "")
    from kdelay.verifier.cli import command

    help_text = CliRunner().invoke(command, ["--help"]).output
    for option in (
        "--executor-memory",
        "--executor-cores",
        "--kubernetes-image",
        "--executor-instances",
        "--kubernetes-namespace",
        "--kubernetes-driver-pod",
        "--driver-host",
    ):
        assert option in help_text
    # A mapping has no flag: KDELAY_VERIFIER_SPARK_CONF (JSON) or the config file.
    assert "--spark-conf" not in help_text
