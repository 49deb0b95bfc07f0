"""The proxy's upstream principal holds the ACLs it needs (kdelay/acls.py), checked at start.

Only when the upstream clients log in with SASL as a user (PLAIN, SCRAM): a PLAINTEXT dev stack,
or an OAUTHBEARER login whose principal only the token names, is not checked. Internal topics
that do not exist yet are asked for CREATE, created (with ``ensure_topics``), then asked again.
Blocking: the proxy calls :func:`check` on a thread (``asyncio.to_thread``) before it connects
its producer.
"""

from __future__ import annotations

from kdelay import acl_check, logs
from kdelay.acls import Acl, proxy_acls
from kdelay.proxy.config import ProxyConfig
from kdelay.topics import ensure_internal_topics

log = logs.get(__name__)


def check(cfg: ProxyConfig) -> list[Acl] | None:
    """Raise kdelay.acl_check.MissingAclsError naming what the upstream principal lacks;
    return the ACLs not asked, or None when not checked (no SASL user)."""
    principal = cfg.upstream_principal()
    if principal is None:
        return None
    conf = {"bootstrap.servers": cfg.bootstrap_servers, **cfg.upstream_client_config()}
    wanted = proxy_acls(ensure_topics=cfg.ensure_topics)
    unchecked = acl_check.require("proxy", principal, wanted, conf)
    if cfg.ensure_topics and acl_check.awaiting_topics(unchecked):
        # Create them now (the start-up's own ensure_internal_topics then finds them) and ask
        # what could not be asked of topics that did not exist.
        ensure_internal_topics(
            cfg.bootstrap_servers,
            partitions=cfg.buffer_partitions,
            replication=cfg.buffer_replication,
            min_insync=cfg.buffer_min_insync_replicas,
            client_config=cfg.upstream_client_config(),
        )
        unchecked = acl_check.require("proxy", principal, wanted, conf)
    return unchecked
