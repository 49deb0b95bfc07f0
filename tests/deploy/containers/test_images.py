"""The images ``make containers`` builds do what compose.yaml and the tests ask of them.

Kafka (1 and 3 KRaft nodes) and ZooKeeper are exercised by every fixture of this run; here: the
3-node cluster from the containers' side, the verifier image's Spark and Java, and the Prometheus
image loading the project's configuration and alerting rules.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.admin import AdminClient

from tests.support.deploy_tools import ROOT
from tests.support.infra import ContainerSession, KafkaInfra, containers
from tests.support.kafka_helpers import consume_until, create_topic, produce_all, unique_topic


@pytest.fixture(scope="module")
def session() -> Iterator[ContainerSession]:
    with containers() as running:
        yield running


def test_three_kraft_nodes_in_containers_survive_one_killed(kafka_cluster: KafkaInfra) -> None:
    cluster = kafka_cluster.require_local("killing a broker")
    bootstrap = kafka_cluster.bootstrap_servers
    brokers = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers
    assert sorted(brokers) == [1, 2, 3]
    topic = unique_topic("rf3-containers")
    create_topic(bootstrap, topic, partitions=3, replication=3, config={"min.insync.replicas": "2"})
    cluster.kill_node(0)  # SIGKILL the container of node 1, a controller voter too
    try:
        survivors = ",".join(n.bootstrap for n in cluster.nodes[1:])
        produce_all(
            survivors,
            topic,
            [(None, f"v{i}".encode(), []) for i in range(200)],
            **{"enable.idempotence": True, "message.timeout.ms": 60000},
        )
        got = consume_until(survivors, [topic], lambda r: len(r) >= 200, timeout=60)
        assert sorted(r.value or b"" for r in got) == sorted(f"v{i}".encode() for i in range(200))
    finally:
        cluster.start_node(0)
        cluster.wait_ready(expected=3)


def test_the_verifier_image_has_spark_and_java_17(session: ContainerSession) -> None:
    image = session.image("verifier")
    java = session.run("--entrypoint", "java", image, "-version")
    assert 'version "17' in java.stderr
    verify = session.run(image, "verify", "--help")
    assert "--once" in verify.stdout
    spark = session.run(
        "--entrypoint", "python", image, "-c", "import pyspark; print(pyspark.__version__)"
    )
    assert spark.stdout.strip().startswith("4.")


def test_the_prometheus_image_loads_the_projects_config_and_rules(
    session: ContainerSession,
) -> None:
    image = session.image("prometheus")
    result = session.run(
        "-v",
        f"{ROOT / 'deploy' / 'prometheus'}:/etc/prometheus:ro",
        "--entrypoint",
        "promtool",
        image,
        "check",
        "config",
        "/etc/prometheus/prometheus.yml",
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
    assert "rules.yml" in result.stdout + result.stderr
