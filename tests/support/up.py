"""`kdelay up` as a subprocess, the way a user runs it: start, wait for `kdelay ready`, SIGTERM."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType
from confluent_kafka.admin._scram import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from dev.stack.leftovers import Managed, managed
from dev.stack.process import ManagedProcess, python_argv, wait_until


@dataclass
class UpProcess:
    """A running `kdelay up`: its process, work dir and state file (CONTRACT.md)."""

    process: ManagedProcess
    workdir: Path
    state_file: Path
    state: dict[str, Any] = field(default_factory=dict)
    #: Set when the context exits: the exit status after SIGTERM.
    exit_code: int | None = None

    @property
    def log(self) -> str:
        return self.process.log_path.read_text(errors="replace")


@contextmanager
def kdelay_up(
    workdir: Path, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> Iterator[UpProcess]:
    """Run ``kdelay up ARGS`` with its data and state under ``workdir`` (and ``env`` added to
    the environment it and its children get) until the block ends; then SIGTERM it and record
    its exit status in ``exit_code``."""
    state_file = workdir / "up.json"
    proc = ManagedProcess(
        "kdelay-up",
        python_argv(
            "up", "--data-dir", str(workdir / "data"), "--state-file", str(state_file), *args
        ),
        workdir / "up.log",
        env=None if env is None else {**os.environ, **env},
    )
    up = UpProcess(proc, workdir, state_file)
    proc.start()
    try:
        wait_until(
            lambda: state_file.exists() and "kdelay ready" in up.log,
            timeout=timeout,
            what="`kdelay up` to print 'kdelay ready'",
            proc=proc,
            interval=0.2,
        )
        up.state = json.loads(state_file.read_text())
        yield up
    finally:
        proc.signal(signal.SIGTERM)
        wait_until(lambda: not proc.alive(), timeout=120, what="`kdelay up` to exit on SIGTERM")
        up.exit_code = proc.returncode()
        proc.stop()


def read_state(up: UpProcess) -> dict[str, Any]:
    """The state file as it is now (``kdelay up`` rewrites it after restarting a child)."""
    doc: dict[str, Any] = json.loads(up.state_file.read_text())
    return doc


def replica_pid(up: UpProcess, name: str) -> int:
    """The pid the state file gives for replica ``name`` now."""
    [pid] = [int(r["pid"]) for r in read_state(up)["replicas"] if r["name"] == name]
    return pid


def cluster_status(zk_connect: str, zk_root: str | None = None) -> dict[str, Any]:
    """``kdelay status --json`` against ``zk_connect`` (and ``zk_root``), as a user would run
    it."""
    root = [] if zk_root is None else ["--zk-root", zk_root]
    result = subprocess.run(
        python_argv("status", "--zk-connect", zk_connect, *root, "--json"),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def roles(status: dict[str, Any]) -> dict[str, str]:
    """Replica name -> role in a ``kdelay status --json`` document."""
    return {str(r["name"]): str(r["role"]) for r in status["replicas"]}


def confirmed_master(status: dict[str, Any]) -> str | None:
    """The master a ``kdelay status --json`` document names, if that replica also says it is
    master (else None: an election or a hand-over in progress)."""
    master = status["master"]
    return str(master) if master is not None and roles(status).get(master) == "master" else None


def children_of(owner: int) -> list[Managed]:
    """Running processes that carry ``owner``'s kdelay.managed marker (its children)."""
    return [m for m in managed() if m.owner == owner]


def sasl_config(state: dict[str, Any], user: str, password: str) -> dict[str, str]:
    """A librdkafka configuration logging in as ``user`` to ``kdelay up --secure``'s Kafka or
    proxy (SASL_SSL, SCRAM-SHA-512, trusting the stack's CA)."""
    sec = state["security"]
    return {
        "security.protocol": sec["protocol"],
        "sasl.mechanism": sec["mechanism"],
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": sec["ca_file"],
    }


def admin_config(state: dict[str, Any]) -> dict[str, str]:
    """:func:`sasl_config` of the stack's Kafka super user (the state file's)."""
    admin = state["security"]["admin"]
    return sasl_config(state, admin["username"], admin["password"])


def add_user(state: dict[str, Any], name: str, topic: str | None = None) -> str:
    """A SCRAM-SHA-512 user of ``kdelay up --secure``'s Kafka (allowed WRITE and DESCRIBE on
    ``topic`` if given), made as its super user; the user's password."""
    password = secrets.token_urlsafe(16)
    admin = AdminClient({"bootstrap.servers": state["kafka"], **admin_config(state)})
    upsert = UserScramCredentialUpsertion(
        name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
    )
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)
    if topic is not None:
        grant_write(state, name, topic)
    return password


def grant_write(state: dict[str, Any], user: str, topic: str) -> None:
    """Allow ``user`` to WRITE and DESCRIBE ``topic`` (as the stack's super user)."""
    admin = AdminClient({"bootstrap.servers": state["kafka"], **admin_config(state)})
    acls = [
        AclBinding(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            op,
            AclPermissionType.ALLOW,
        )
        for op in (AclOperation.WRITE, AclOperation.DESCRIBE)
    ]
    for future in admin.create_acls(acls).values():
        future.result(timeout=30)
