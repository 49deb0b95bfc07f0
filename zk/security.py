"""How a kdelay component logs in to ZooKeeper, and the ACL its znodes carry.

The replicas and the proxy take the same settings. With ``zk_auth_username`` set, a component
adds digest credentials to its session, and every znode kdelay creates gets one ACL, the digest
of that user with all permissions: no other client (an anonymous one gets NoAuth) may read,
create or change the election, registry, layout or checkpoint. ``zk_tls`` connects over TLS.

The password is a secret: ``zk_auth_password`` (environment or config file, never a flag) or
``zk_auth_password_file``, held as a ``SecretStr``.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, model_validator

from kdelay.secrets import read_secret_file


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
        if self.zk_auth_password_file is not None:
            read_secret_file(self.zk_auth_password_file, "zk_auth_password_file")
        return self

    def zk_password(self) -> str | None:
        """The digest password, or None without ZooKeeper authentication."""
        if self.zk_auth_password is not None:
            return self.zk_auth_password.get_secret_value()
        if self.zk_auth_password_file is not None:
            return read_secret_file(self.zk_auth_password_file, "zk_auth_password_file")
        return None
