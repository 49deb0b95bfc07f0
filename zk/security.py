"""How a kdelay component logs in to ZooKeeper, and the ACL its znodes carry.

The replicas and the proxy take the same settings. With ``zk_auth_username`` set, a component
adds digest credentials to its session, and every znode kdelay creates gets one ACL, the digest
of that user with all permissions: no other client (an anonymous one gets NoAuth) may read,
create or change the election, registry, layout or checkpoint. ``zk_tls`` connects over TLS.

The password is a secret: ``zk_auth_password`` (environment or config file, never a flag) or
``zk_auth_password_file``, held as a ``SecretStr``.

:meth:`ZkSecurity.kazoo_kwargs` turns the settings into KazooClient arguments; every kazoo client
kdelay makes (``zk/connection.py``, ``zk/replica_api.py``) takes them. kdelay's modules never pass
an ``acl=`` of their own, so kazoo's ``default_acl`` covers every znode they create: plain,
ephemeral and sequential nodes, and the parents ``ensure_path`` and ``makepath`` create.
A root created before with open ACLs is closed by :func:`zk.acls.close_tree`.

kazoo logs every request it sends at DEBUG, the digest login (``user:password``) included; the
``kazoo.client`` logger, held at WARNING by ``kdelay/logs.py``, also gets a filter that hides that
request's credentials before any handler sees them, whoever configures logging.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kazoo.protocol.serialization import Auth
from kazoo.security import ACL, make_digest_acl
from pydantic import BaseModel, Field, SecretStr, model_validator

from kdelay.secrets import read_secret_file


class _HideAuth(logging.Filter):
    """Replaces a logged kazoo ``Auth`` request by its scheme alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(a, Auth) for a in record.args):
            record.args = tuple(
                f"Auth(scheme={a.scheme!r}, auth=<hidden>)" if isinstance(a, Auth) else a
                for a in record.args
            )
        return True


_HIDE_AUTH = _HideAuth()


def hide_credentials_in_kazoo_logs() -> None:
    """Install the filter on kazoo's logger (idempotent)."""
    logging.getLogger("kazoo.client").addFilter(_HIDE_AUTH)


class ZkSecurity(BaseModel):
    """ZooKeeper security settings shared by the replicas and the proxy."""

    zk_auth_username: str | None = Field(
        default=None,
        description="ZooKeeper digest user kdelay logs in as; kdelay's znodes are then "
        "readable and writable by that user only [none: open znodes]",
    )
    zk_auth_password: SecretStr | None = Field(
        default=None,
        description="that user's password: environment or config file only, never a flag "
        "[zk_auth_password_file]",
    )
    zk_auth_password_file: Path | None = Field(
        default=None, description="file holding that user's password (a mounted Secret)"
    )
    zk_tls: bool = Field(default=False, description="connect to ZooKeeper over TLS")
    zk_tls_ca_file: Path | None = Field(
        default=None, description="PEM CA bundle that signed ZooKeeper's certificate"
    )

    @model_validator(mode="after")
    def _zk_security(self) -> ZkSecurity:
        has_password = self.zk_auth_password is not None or self.zk_auth_password_file is not None
        if self.zk_auth_username and not has_password:
            raise ValueError(
                "zk_auth_username needs zk_auth_password (environment or config file) or "
                "zk_auth_password_file"
            )
        if has_password and not self.zk_auth_username:
            raise ValueError("a ZooKeeper password is set without zk_auth_username")
        if self.zk_auth_password is not None and self.zk_auth_password_file is not None:
            raise ValueError("set one of zk_auth_password and zk_auth_password_file, not both")
        if self.zk_auth_username is not None and (
            not self.zk_auth_username or ":" in self.zk_auth_username
        ):
            # A digest identity is "user:password": the first colon ends the user.
            raise ValueError("zk_auth_username must be non-empty and contain no ':'")
        if self.zk_auth_password is not None and not self.zk_auth_password.get_secret_value():
            raise ValueError("zk_auth_password is empty")
        if self.zk_auth_password_file is not None:
            read_secret_file(self.zk_auth_password_file, "zk_auth_password_file")
        if self.zk_tls_ca_file is not None:
            if not self.zk_tls:
                raise ValueError("zk_tls_ca_file is set but zk_tls is off")
            try:
                self.zk_tls_ca_file.read_bytes()
            except OSError as exc:
                raise ValueError(
                    f"zk_tls_ca_file: cannot read {self.zk_tls_ca_file}: {exc.strerror}"
                ) from None
        return self

    def zk_password(self) -> str | None:
        """The digest password, or None without ZooKeeper authentication."""
        if self.zk_auth_password is not None:
            return self.zk_auth_password.get_secret_value()
        if self.zk_auth_password_file is not None:
            return read_secret_file(self.zk_auth_password_file, "zk_auth_password_file")
        return None

    def zk_acl(self) -> list[ACL] | None:
        """The one ACL of kdelay's znodes (the digest user, all permissions), or None when
        znodes stay open (no ``zk_auth_username``)."""
        password = self.zk_password()
        if self.zk_auth_username is None or password is None:
            return None
        return [make_digest_acl(self.zk_auth_username, password, all=True)]

    def kazoo_kwargs(self) -> dict[str, Any]:
        """KazooClient keyword arguments for these settings (empty: plaintext and open).

        With a user: ``auth_data`` (digest ``user:password``) and ``default_acl``; with TLS:
        ``use_ssl``, the CA bundle (``ca``; else the system's CAs) and certificates verified,
        host names included (the connect string's hosts must be in ZooKeeper's certificate).
        """
        out: dict[str, Any] = {}
        password = self.zk_password()
        if self.zk_auth_username is not None and password is not None:
            hide_credentials_in_kazoo_logs()
            out["auth_data"] = [("digest", f"{self.zk_auth_username}:{password}")]
            out["default_acl"] = self.zk_acl()
        if self.zk_tls:
            out.update(use_ssl=True, verify_certs=True, check_hostname=True)
            if self.zk_tls_ca_file is not None:
                out["ca"] = str(self.zk_tls_ca_file)
        return out
