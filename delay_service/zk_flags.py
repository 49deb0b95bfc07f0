"""The ZooKeeper login and TLS flags of the commands that read or write a delay set's znodes
(``kdelay status``, ``kdelay list``, ``kdelay reshard``), as the replicas log in
(zk/security.py): each flag also read from the replicas' own variable, the password never a
flag.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from pydantic import SecretStr, ValidationError

from kdelay.zk.security import ZkSecurity

if TYPE_CHECKING:
    from kdelay.zk.access import ZkClient

F = TypeVar("F", bound=Callable[..., Any])

#: Where ``kdelay status`` and ``kdelay reshard`` read the ZooKeeper password, first found wins.
PASSWORD_ENV = ("KDELAY_ZK_AUTH_PASSWORD", "KDELAY_REPLICA_ZK_AUTH_PASSWORD")


def zk_security_options(func: F) -> F:
    """The ZooKeeper login and TLS flags of ``kdelay status`` and ``kdelay reshard``."""
    options = [
        click.option(
            "--zk-auth-username",
            envvar="KDELAY_REPLICA_ZK_AUTH_USERNAME",
            help="ZooKeeper digest user (the replicas' zk_auth_username); its password from "
            f"{' or '.join(PASSWORD_ENV)}, or --zk-auth-password-file",
        ),
        click.option(
            "--zk-auth-password-file",
            envvar="KDELAY_REPLICA_ZK_AUTH_PASSWORD_FILE",
            type=click.Path(path_type=Path),
            help="file holding that user's password",
        ),
        click.option(
            "--zk-tls/--no-zk-tls",
            envvar="KDELAY_REPLICA_ZK_TLS",
            default=False,
            help="connect to ZooKeeper over TLS",
        ),
        click.option(
            "--zk-tls-ca-file",
            envvar="KDELAY_REPLICA_ZK_TLS_CA_FILE",
            type=click.Path(path_type=Path),
            help="PEM CA bundle that signed ZooKeeper's certificate [the system's CAs]",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def zk_security(
    zk_auth_username: str | None,
    zk_auth_password_file: Path | None,
    zk_tls: bool,
    zk_tls_ca_file: Path | None,
) -> ZkSecurity:
    """The ZooKeeper settings of a command's flags and the password's environment; a usage
    error naming the setting when they do not fit together (never the password)."""
    password = next((os.environ[n] for n in PASSWORD_ENV if os.environ.get(n)), None)
    try:
        return ZkSecurity(
            zk_auth_username=zk_auth_username,
            zk_auth_password=None if password is None else SecretStr(password),
            zk_auth_password_file=zk_auth_password_file,
            zk_tls=zk_tls,
            zk_tls_ca_file=zk_tls_ca_file,
        )
    except ValidationError as exc:
        why = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        raise click.UsageError(f"ZooKeeper security: {why}") from None


def check_access(client: ZkClient, zk_root: str, security: ZkSecurity) -> None:
    """Fail with what to give when ZooKeeper will not let this session read ``zk_root`` (a
    root not created yet is not an error here)."""
    from kdelay.zk.access import may_list

    if not may_list(client, zk_root):
        raise no_auth(zk_root, security)


def no_auth(zk_root: str, security: ZkSecurity) -> click.ClickException:
    """ZooKeeper said NoAuth: name what to give."""
    if security.zk_auth_username is None:
        hint = (
            "its znodes are closed to anonymous clients: give the replicas' ZooKeeper user "
            f"(--zk-auth-username, the password in {PASSWORD_ENV[0]} or --zk-auth-password-file)"
        )
    else:
        hint = f"is the password of ZooKeeper user {security.zk_auth_username!r} right?"
    return click.ClickException(f"ZooKeeper refused access under {zk_root} (NoAuth): {hint}")
