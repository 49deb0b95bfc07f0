"""Kafka client security settings: librdkafka and Spark names, the proxy's merged upstream
settings, the ACL table and the start-up check's verdicts and message (fakes, no Kafka)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from pydantic import ValidationError

from kdelay import acl_check, acls
from kdelay.acls import Acl, kafka_acls_command
from kdelay.delay_service.config import ReplicaConfig
from kdelay.delay_service.release.txn_sender import TxnSender
from kdelay.errors import InfrastructureError
from kdelay.kafka_security import merge_client_config
from kdelay.proxy.client import ClientSecurity, send_command
from kdelay.proxy.config import ProxyConfig
from kdelay.verifier.config import VerifierConfig
from kdelay.verifier.source import kafka_security_options

PASSWORD = 's3cr"et\\pw'  # noqa: S105 - a test value; a quote and a backslash: JAAS escaping


def _sasl(**extra: Any) -> dict[str, Any]:
    return {
        "kafka_security_protocol": "SASL_SSL",
        "kafka_sasl_username": "svc",
        "kafka_sasl_password": PASSWORD,
        "kafka_ssl_ca_file": Path("/ca.pem"),
        **extra,
    }


def test_client_config_has_librdkafka_names_and_the_repr_hides_the_password() -> None:
    cfg = ReplicaConfig(name="r", **_sasl())
    assert cfg.kafka_connection("b:9093") == {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": "/ca.pem",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": PASSWORD,
    }
    assert cfg.kafka_principal() == "User:svc"
    assert PASSWORD not in repr(cfg)
    assert PASSWORD not in str(cfg.model_dump(mode="json"))
    assert ReplicaConfig(name="r").kafka_principal() is None


def test_the_password_file_is_read(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    cfg = VerifierConfig(
        **_sasl(kafka_sasl_password=None, kafka_sasl_password_file=secret, kafka_ssl_ca_file=None)
    )
    assert cfg.kafka_client_config()["sasl.password"] == "from-file"


#: Two certificates (a bundle); the text is passed as it is, only its PEM form is checked.
CA_PEM = (
    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    "-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n"
)


def _ca(tmp_path: Path) -> Path:
    ca = tmp_path / "ca.pem"
    ca.write_text(CA_PEM)
    return ca


def test_spark_options_carry_the_ca_bundle_by_value_and_an_escaped_jaas_login(
    tmp_path: Path,
) -> None:
    ca = _ca(tmp_path)
    opts = kafka_security_options(
        VerifierConfig(**_sasl(kafka_sasl_mechanism="SCRAM-SHA-256", kafka_ssl_ca_file=ca))
    )
    assert opts == {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.ssl.truststore.type": "PEM",
        # By value: an executor on another machine or pod has no file at the driver's path.
        "kafka.ssl.truststore.certificates": CA_PEM,
        "kafka.sasl.mechanism": "SCRAM-SHA-256",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        'required username="svc" password="s3cr\\"et\\\\pw";',
    }
    plain = kafka_security_options(
        VerifierConfig(**_sasl(kafka_sasl_mechanism="PLAIN", kafka_ssl_ca_file=ca))
    )
    assert plain["kafka.sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
    )
    assert kafka_security_options(VerifierConfig()) == {"kafka.security.protocol": "PLAINTEXT"}
    # Without TLS the CA is not used, so not read.
    no_tls = _sasl(kafka_security_protocol="SASL_PLAINTEXT")
    assert "kafka.ssl.truststore.certificates" not in kafka_security_options(
        VerifierConfig(**no_tls)
    )


@pytest.mark.parametrize(
    ("content", "error"),
    [
        (None, "kafka_ssl_ca_file: cannot read"),
        ("not a certificate\n", "holds no PEM certificate"),
        (b"\xff\xfe", "not a PEM file"),
    ],
)
def test_a_verifier_ca_file_it_cannot_use_is_refused_at_start_naming_the_setting(
    tmp_path: Path, content: str | bytes | None, error: str
) -> None:
    ca = tmp_path / "ca.pem"
    if isinstance(content, bytes):
        ca.write_bytes(content)
    elif content is not None:
        ca.write_text(content)
    with pytest.raises(ValidationError, match=error):
        VerifierConfig(**_sasl(kafka_ssl_ca_file=ca))


def test_merge_adds_upstream_settings_and_plaintext_default_gives_way() -> None:
    merged = merge_client_config(
        {"security.protocol": "PLAINTEXT"},
        {"security.protocol": "SASL_SSL", "linger.ms": "5"},
        "upstream_config",
    )
    assert merged == {"security.protocol": "SASL_SSL", "linger.ms": "5"}


def test_merge_refuses_a_contradiction_naming_both_settings_and_no_password() -> None:
    with pytest.raises(ValueError, match="kafka_security_protocol") as err:
        merge_client_config(
            {"security.protocol": "SASL_SSL"}, {"security.protocol": "SSL"}, "upstream_config"
        )
    assert "upstream_config['security.protocol']" in str(err.value)
    with pytest.raises(ValueError, match="kafka_sasl_password") as err:
        merge_client_config(
            {"sasl.password": PASSWORD}, {"sasl.password": "other-secret"}, "upstream_config"
        )
    assert "other-secret" not in str(err.value)
    assert PASSWORD not in str(err.value)


def test_proxy_upstream_config_merges_the_kafka_settings() -> None:
    cfg = ProxyConfig(
        **_sasl(upstream_config={"linger.ms": "3"}), listener_allow_unauthenticated=True
    )
    conf = cfg.upstream_client_config()
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.password"] == PASSWORD
    assert conf["linger.ms"] == "3"
    assert cfg.upstream_principal() == "User:svc"
    # The old way (everything in upstream_config) still works, and names its principal.
    old = ProxyConfig(
        upstream_config={
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "old",
            "sasl.password": "pw",
        },
        listener_allow_unauthenticated=True,
    )
    assert old.upstream_principal() == "User:old"
    assert ProxyConfig().upstream_principal() is None


def test_proxy_refuses_contradicting_protocols_and_a_sasl_listener_on_a_plain_upstream() -> None:
    with pytest.raises(ValidationError, match="kafka_security_protocol"):
        ProxyConfig(**_sasl(upstream_config={"security.protocol": "PLAINTEXT"}))
    with pytest.raises(ValidationError, match="must be SASL_SSL or SASL_PLAINTEXT"):
        ProxyConfig(listener_security_protocol="SASL_PLAINTEXT")
    # The kafka_* settings alone make the upstream SASL for a SASL listener.
    ok = ProxyConfig(
        listener_security_protocol="SASL_PLAINTEXT", http_allow_unauthenticated=True, **_sasl()
    )
    assert ok.sasl_enabled


def test_send_and_cancel_take_the_password_from_the_environment_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KDELAY_KAFKA_SASL_PASSWORD", PASSWORD)
    cfg = ClientSecurity(kafka_security_protocol="SASL_SSL", kafka_sasl_username="alice")
    assert cfg.kafka_client_config()["sasl.password"] == PASSWORD
    assert "kafka_sasl_password" not in {p.name for p in send_command.params}


# -- the ACL table -------------------------------------------------------------------------


def test_the_table_names_each_components_needs() -> None:
    t = acls.table()
    assert set(t) == {"proxy", "replica", "verifier", "client"}
    replica = {(a.resource, a.name, a.pattern, a.operation) for a in t["replica"] if a.required}
    assert ("TOPIC", "__kdelay_buffer", "LITERAL", "READ") in replica
    assert ("TRANSACTIONAL_ID", "kdelay-release:", "PREFIXED", "WRITE") in replica
    assert ("TOPIC", "__kdelay_checkpoint", "LITERAL", "WRITE") in replica
    proxy = {(a.resource, a.name, a.operation) for a in t["proxy"] if a.required}
    assert ("TOPIC", "__kdelay_buffer", "WRITE") in proxy
    assert ("TOPIC", "__kdelay_buffer", "READ") not in proxy  # the proxy never reads it
    at_least_once = acls.replica_acls(exactly_once=False)
    assert not any(a.resource == "TRANSACTIONAL_ID" for a in at_least_once)
    created = {a.name for a in acls.proxy_acls(ensure_topics=False) if a.operation == "CREATE"}
    assert created == {"__kdelay_clock"}  # the broker clock creates its topic anyway
    assert not any(a.name == "__kdelay_verifier" for a in acls.verifier_acls(output_topic=""))
    assert "| replica (User:kdelay-replica) | TOPIC `__kdelay_buffer` |" in acls.markdown_table()


def test_kafka_acls_command() -> None:
    lit = Acl("TOPIC", "__kdelay_buffer", "LITERAL", "READ", "why")
    assert kafka_acls_command("User:r", lit, "k:9093") == (
        "kafka-acls.sh --bootstrap-server k:9093 --command-config admin.properties --add "
        "--allow-principal User:r --operation Read --topic __kdelay_buffer"
    )
    pre = Acl("TRANSACTIONAL_ID", "kdelay-release:", "PREFIXED", "WRITE", "why")
    assert kafka_acls_command("User:r", pre).endswith(
        "--transactional-id kdelay-release: --resource-pattern-type prefixed"
    )
    cfgs = Acl("TOPIC", "__kdelay_clock", "LITERAL", "DESCRIBE_CONFIGS", "why")
    assert "--operation DescribeConfigs" in kafka_acls_command("User:r", cfgs)


# -- the start-up check, against a fake admin client ------------------------------------------


class _Op:
    def __init__(self, name: str) -> None:
        self.name = name


class _Described:
    def __init__(self, ops: list[str]) -> None:
        self.authorized_operations = [_Op(o) for o in ops]


def _done(value: Any = None, error: int | None = None) -> Future[Any]:
    f: Future[Any] = Future()
    if error is None:
        f.set_result(value)
    else:
        f.set_exception(KafkaException(KafkaError(error)))
    return f


class FakeAdmin:
    """Kafka's answers: per topic its operations or an error code, per group its operations,
    and which topics the principal may create."""

    def __init__(
        self,
        topics: dict[str, list[str] | int],
        groups: dict[str, list[str]],
        creatable: set[str],
        cluster: list[str] | None = None,
    ) -> None:
        self.topics, self.groups, self.creatable = topics, groups, creatable
        self.cluster = cluster or []
        self.created: list[str] = []

    def describe_cluster(self, **_: Any) -> Future[Any]:
        return _done(_Described(self.cluster))

    def describe_topics(self, topics: Any, **_: Any) -> dict[str, Future[Any]]:
        out = {}
        for name in topics.topic_names:
            answer = self.topics.get(name, KafkaError.UNKNOWN_TOPIC_OR_PART)
            out[name] = (
                _done(error=answer) if isinstance(answer, int) else _done(_Described(answer))
            )
        return out

    def create_topics(self, new: list[Any], **kw: Any) -> dict[str, Future[Any]]:
        assert kw["validate_only"] is True
        name = new[0].topic
        self.created.append(name)
        if name in self.creatable:
            return {name: _done()}
        return {name: _done(error=KafkaError.TOPIC_AUTHORIZATION_FAILED)}

    def describe_consumer_groups(self, groups: list[str], **_: Any) -> dict[str, Future[Any]]:
        name = groups[0]
        if name not in self.groups:
            return {name: _done(error=KafkaError.GROUP_AUTHORIZATION_FAILED)}
        return {name: _done(_Described(self.groups[name]))}


def test_the_check_finds_each_missing_acl_and_what_it_cannot_ask() -> None:
    admin = FakeAdmin(
        topics={
            "__kdelay_buffer": ["DESCRIBE", "WRITE"],  # no READ
            "__kdelay_dead_letter": ["ALL"],
            "__kdelay_checkpoint": KafkaError.TOPIC_AUTHORIZATION_FAILED,  # nothing at all
            # __kdelay_clock missing: its CREATE is asked by validation only
        },
        groups={"kdelay-replica-r1": ["READ", "DESCRIBE"]},
        creatable={"__kdelay_clock"},
    )
    missing, unchecked = acl_check.missing_acls(
        admin,  # type: ignore[arg-type]
        acls.replica_acls(),
        probes={acls.REPLICA_GROUPS: "kdelay-replica-r1"},
    )
    named = {(a.name, a.operation) for a in missing}
    assert ("__kdelay_buffer", "READ") in named
    assert ("__kdelay_buffer", "WRITE") not in named
    assert {("__kdelay_checkpoint", "READ"), ("__kdelay_checkpoint", "WRITE")} <= named
    assert ("__kdelay_checkpoint", "CREATE") in named  # denied DESCRIBE: may not create either
    assert not any(a.name == "__kdelay_dead_letter" for a in missing)
    assert ("__kdelay_clock", "CREATE") not in named
    assert (acls.CLUSTER, "DESCRIBE") in named  # DescribeAcls, for the owners' WRITE
    assert sorted(admin.created) == ["__kdelay_checkpoint", "__kdelay_clock"]  # once each
    not_asked = {(a.resource, a.name) for a in unchecked}
    assert ("TOPIC", acls.TARGETS) in not_asked
    assert ("TRANSACTIONAL_ID", acls.RELEASE_TRANSACTIONAL_IDS) in not_asked
    assert ("TOPIC", "__kdelay_clock") in not_asked  # WRITE on a topic not there yet


def test_a_denied_group_is_missing() -> None:
    admin = FakeAdmin(topics={}, groups={}, creatable=set())
    missing, _ = acl_check.missing_acls(
        admin,  # type: ignore[arg-type]
        [Acl("GROUP", "kdelay-verifier", "PREFIXED", "READ", "why")],
        probes={"kdelay-verifier": "kdelay-verifier-x"},
    )
    assert [a.name for a in missing] == ["kdelay-verifier"]


def test_the_error_names_principal_operation_resource_and_command() -> None:
    acl = Acl("TOPIC", "__kdelay_buffer", "LITERAL", "READ", "ingest reads the buffer")
    err = acl_check.MissingAclsError("replica", "User:r", [acl], "k:9093")
    text = str(err)
    assert "replica: Kafka principal User:r lacks 1 ACL(s)" in text
    assert "READ on TOPIC __kdelay_buffer (ingest reads the buffer)" in text
    assert "kafka-acls.sh --bootstrap-server k:9093" in text
    assert "--allow-principal User:r --operation Read --topic __kdelay_buffer" in text


def test_require_raises_only_for_required_acls(monkeypatch: pytest.MonkeyPatch) -> None:
    optional = Acl("TOPIC", "t", "LITERAL", "DESCRIBE_CONFIGS", "why", required=False)
    required = Acl("TOPIC", "t", "LITERAL", "WRITE", "why")
    admin = FakeAdmin(topics={"t": ["DESCRIBE", "READ"]}, groups={}, creatable=set())
    monkeypatch.setattr(acl_check, "AdminClient", lambda _conf: admin)
    assert acl_check.require("c", "User:u", [optional], {"bootstrap.servers": "k"}) == []
    with pytest.raises(acl_check.MissingAclsError) as err:
        acl_check.require("c", "User:u", [optional, required], {"bootstrap.servers": "k"})
    assert err.value.missing == [required]


class _DeniedTxnProducer:
    def init_transactions(self, timeout: float = -1) -> None:
        raise KafkaException(
            KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied", fatal=True)
        )


def test_a_denied_transactional_id_is_named_with_its_grant_not_taken_for_a_fencing() -> None:
    """The one ACL start-up cannot ask: init_transactions names it (not FencedError)."""
    sender = TxnSender(
        _DeniedTxnProducer,  # type: ignore[arg-type]
        buffer_topic="__kdelay_buffer",
        produce_timeout_ms=1000,
        checkpoint_key="set",
        principal="User:rep",
    )
    with pytest.raises(InfrastructureError) as err:
        sender.start()
    text = str(err.value)
    assert "Kafka denies User:rep WRITE on TRANSACTIONAL_ID kdelay-release:*" in text
    assert "--allow-principal User:rep --operation Write --transactional-id kdelay-release:" in text


def test_a_topic_hidden_from_describe_says_nothing_of_describe_configs() -> None:
    """DESCRIBE_CONFIGS does not imply DESCRIBE: a principal holding it alone is not told it
    lacks it (it was, before)."""
    admin = FakeAdmin(
        topics={"t": KafkaError.TOPIC_AUTHORIZATION_FAILED}, groups={}, creatable=set()
    )
    configs = Acl("TOPIC", "t", "LITERAL", "DESCRIBE_CONFIGS", "why", required=False)
    write = Acl("TOPIC", "t", "LITERAL", "WRITE", "why")
    missing, unchecked = acl_check.missing_acls(admin, [configs, write])  # type: ignore[arg-type]
    assert missing == [write]
    assert unchecked == [configs]
