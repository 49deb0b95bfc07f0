"""The replicas' revocation panel: releases refused because the owner may no longer WRITE, and
the questions to Kafka about ACLs that failed (docs/security.md, "Revocation")."""

from __future__ import annotations

from dev.tools.grafana.panels import MASTER, RATE, Panel, q

REVOKED_OWNERS = Panel(
    "Revoked owners: releases refused, ACLs not answered (masters)",
    [
        q(f"sum(rate(kdelay_replica_owner_refused_total[{RATE}]) and {MASTER})", "refused"),
        q(
            f"sum(rate(kdelay_replica_owner_acl_failures_total[{RATE}]) and {MASTER})",
            "DescribeAcls failed",
        ),
        q(f"sum(kdelay_replica_owner_unchecked_messages and {MASTER})", "held: owner not checked"),
        q(
            f"max(kdelay_replica_buffer_foreign_writers and {MASTER})",
            "foreign buffer writers (all held)",
        ),
    ],
    "short",
    description="Releases refused because the message's owner may no longer WRITE its target "
    "by Kafka's ACLs (dead-lettered), questions to Kafka about a target's ACLs that failed, and "
    "due owned messages held pending because of them; and the ACL bindings that let a principal "
    "other than kdelay's WRITE the buffer topic (while any exists the master releases nothing: "
    'docs/security.md, "The buffer\'s writers").',
)
