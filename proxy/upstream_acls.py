"""The proxy's upstream principal holds the ACLs it needs (kdelay/acls.py), checked at start.

Only when the upstream clients log in with SASL as a user (PLAIN, SCRAM): a PLAINTEXT dev stack,
or an OAUTHBEARER login whose principal only the token names, is not checked. Blocking: the
proxy calls :func:`check` on a thread (``asyncio.to_thread``) before it creates topics or
connects its producer.
"""

from __future__ import annotations

from kdelay import acl_check, logs
from kdelay.acls import Acl, proxy_acls
from proxy.config import ProxyConfig

log = logs.get(__name__)


def check(cfg: ProxyConfig) -> list[Acl] | None:
    """Raise kdelay.acl_check.MissingAclsError naming what the upstream principal lacks;
    return the ACLs not asked, or None when not checked (no SASL user)."""
    principal = cfg.upstream_principal()
    if principal is None:
        return None
    conf = {"bootstrap.servers": cfg.bootstrap_servers, **cfg.upstream_client_config()}
    return acl_check.require("proxy", principal, proxy_acls(ensure_topics=cfg.ensure_topics), conf)
