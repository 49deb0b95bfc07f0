"""The dashboards' panel lists: overview, replicas and proxy, and the file each is written to.

Edit a panel here, then run ``python dev/tools/dashboards.py`` and commit the JSON it writes.
"""

from __future__ import annotations

from grafana_foundation_sdk.models.dashboard import Dashboard

from dev.tools.grafana.owner_panels import REVOKED_OWNERS
from dev.tools.grafana.panels import (
    MASTER,
    RATE,
    Panel,
    by,
    errs,
    lateness,
    per_shard,
    q,
    total,
)
from dev.tools.grafana.render import dashboard

OVERVIEW = [
    Panel(
        "Produce rate (proxy)",
        [by("kdelay_proxy_records_total", "kind")],
        "rps",
        description="Records routed by the proxy, by kind (immediate, delayed, cancel, rejected).",
    ),
    Panel(
        "Ingest rate (buffer topic)",
        [q(f"max by (kind) (rate(kdelay_replica_ingested_total[{RATE}]))", "{{kind}}")],
        "rps",
        description="Buffer records ingested by the busiest replica (with one shard every "
        "replica ingests everything; with more, a replica ingests its shard's partitions).",
    ),
    Panel(
        "Pending messages (masters)",
        [q(f"sum(kdelay_replica_pending_messages and {MASTER})", "pending")],
        "short",
        kind="stat",
        width=6,
        description="Summed over the shards' masters (one shard: the master's).",
    ),
    Panel(
        "Current master (per shard)",
        [
            q(
                f"max by (shard, instance) ({per_shard('kdelay_replica_is_master')} == 1)",
                "{{shard}} {{instance}}",
            )
        ],
        "none",
        kind="stat",
        width=6,
        show_name=True,
        description="The replica holding each shard's election; a shard without one forwards "
        "nothing (KdelayNoMaster names it).",
    ),
    Panel(
        "Due soon (masters)",
        [q(f"sum by (within) (kdelay_replica_due_messages and {MASTER})", "{{within}}")],
        "short",
        kind="bargauge",
        description="Pending messages due within each window (cumulative), over the shards.",
    ),
    Panel(
        "Due in the next hour / day (masters)",
        [
            q(f'sum(kdelay_replica_due_messages{{within="1h"}} and {MASTER})', "next hour"),
            q(f'sum(kdelay_replica_due_messages{{within="1d"}} and {MASTER})', "next day"),
        ],
        "short",
        kind="stat",
        description="Pending messages due within the next hour and day, overdue ones included "
        "(the count stops at 50,000). The proxy's GET /v1/pending gives the timeline per "
        "bucket and target topic (docs/status.md); alert KdelayDueSpike.",
    ),
    Panel(
        "Forward rate",
        [q(f"sum(rate(kdelay_replica_forwarded_total[{RATE}]))", "forwarded")],
        "rps",
    ),
    Panel(
        "Lateness (release - due)",
        lateness("kdelay_replica_lateness_seconds"),
        "s",
        description="From the master's histogram; alert KdelayLatenessHigh on p99.",
    ),
    Panel(
        "Release smoothing: extra lateness by topic",
        [
            q(
                f"histogram_quantile({p}, sum by (topic, le) "
                f"(rate(kdelay_replica_release_smoothing_delay_seconds_bucket[{RATE}])))",
                f"{{{{topic}}}} p{round(p * 100)}",
            )
            for p in (0.5, 0.99)
        ],
        "s",
        description="Lateness of the messages a release rate limit held back "
        "(--release-rate-limit, release_rate_limits), per target topic: the price of smoothing "
        "a burst. It is part of the lateness above too; other topics are not delayed by it.",
    ),
    Panel(
        "Verifier: early / duplicates / missing",
        [
            q(f"sum(increase(kdelay_verifier_early_total[{RATE}]))", "early"),
            q(f"sum(increase(kdelay_verifier_duplicates_total[{RATE}]))", "duplicates"),
            q(f"sum(increase(kdelay_verifier_missing_total[{RATE}]))", "missing"),
        ],
        "short",
        description="Only while `kdelay verify` runs. Early or missing is a correctness bug.",
    ),
    Panel(
        "Errors",
        [
            total("kdelay_replica_dead_lettered_total", "dead-lettered"),
            total("kdelay_replica_forward_errors_total", "forward errors"),
            total("kdelay_proxy_upstream_errors_total", "proxy upstream"),
            errs("kdelay_replica_transactions_total", "outcome"),
        ],
        "rps",
        description="Exactly-once release: an aborted transaction is sent again (by outcome).",
    ),
    Panel(
        "Ingest lag per shard (slowest replica)",
        [
            q(
                f"max by (shard) ({per_shard('kdelay_replica_buffer_lag_messages')})",
                "shard {{shard}}",
            )
        ],
        "short",
        description="Buffer records the slowest replica of each shard has not ingested yet. "
        "A shard whose lag keeps growing cannot keep up: docs/operations.md, Shards.",
    ),
]

REPLICAS = [
    Panel(
        "Buffer lag",
        [q("kdelay_replica_buffer_lag_messages", "{{instance}}")],
        "short",
        description="Buffer-topic records not yet ingested (alert KdelayReplicaLagging).",
    ),
    Panel(
        "Checkpoint age",
        [q("kdelay_replica_checkpoint_age_seconds", "{{instance}}")],
        "s",
        description="Since the last checkpoint each replica saw or wrote (KdelayCheckpointTooOld).",
    ),
    Panel("Role (1 = master)", [q("kdelay_replica_is_master", "{{instance}}")], "none"),
    Panel(
        "Release round phases (p99)",
        [
            q(
                "histogram_quantile(0.99, sum by (le, phase) "
                f"(rate(kdelay_replica_round_phase_seconds_bucket[{RATE}])))",
                "{{phase}}",
            )
        ],
        "s",
        description="Exactly-once rounds: producing, waiting for acknowledgements, committing. "
        "A release is about one round late: this says which part to look at.",
    ),
    Panel(
        "Fenced checkpoint writes",
        [q(f"increase(kdelay_replica_checkpoint_rejected_total[{RATE}])", "{{instance}}")],
        "short",
        description="A master whose checkpoint write was rejected (a newer master exists) "
        "stepped down; a few around a failover are expected.",
    ),
    Panel(
        "ZooKeeper state",
        [q("kdelay_replica_zk_state == 1", "{{instance}} {{state}}")],
        "none",
        description="The current ZooKeeper connection state per replica.",
    ),
    Panel("Store size (RocksDB)", [q("kdelay_replica_store_bytes", "{{instance}}")], "bytes"),
    Panel("Pending messages", [q("kdelay_replica_pending_messages", "{{instance}}")], "short"),
    Panel("Ingest rate by replica", [by("kdelay_replica_ingested_total", "instance")], "rps"),
    Panel("Cancelled", [by("kdelay_replica_cancelled_total", "instance")], "rps"),
    Panel(
        "Cancel outcomes and bulk cancels (masters)",
        [
            q(
                "sum by (outcome) (rate(kdelay_replica_cancel_outcomes_total"
                f"[{RATE}]) and {MASTER})",
                "{{outcome}}",
            ),
            q(f"sum(rate(kdelay_replica_bulk_cancels_total[{RATE}]) and {MASTER})", "bulk cancels"),
            q(
                f"sum(rate(kdelay_replica_bulk_cancelled_messages_total[{RATE}]) and {MASTER})",
                "bulk cancelled messages",
            ),
            q(
                "sum(rate(kdelay_replica_bulk_cancel_refused_messages_total"
                f"[{RATE}]) and {MASTER})",
                "bulk refused (other owners)",
            ),
            q(
                f"sum(rate(kdelay_replica_cancels_refused_total[{RATE}]) and {MASTER})",
                "cancel or replace refused (other owners)",
            ),
        ],
        "rps",
        description="Cancels of one id by what they found (cancelled, already_delivered, "
        "unknown), and bulk cancels (DELETE /v1/messages?id_prefix=..): records, the messages "
        "they cancelled, and those they left to other principals; cancels and replaces of one "
        "id refused for the same reason. Every replica counts the same; the masters' are shown.",
    ),
    REVOKED_OWNERS,
    Panel(
        "Ingest progress age",
        [q("kdelay_replica_ingest_last_progress_seconds", "{{instance}}")],
        "s",
        description="Since ingest last applied records or found itself at the end of the "
        "buffer topic; keeps growing while ingest is stuck (alert KdelayIngestStuck).",
    ),
    Panel(
        "Clock vs the broker's; releases held",
        [q("kdelay_clock_skew_seconds", "skew {{instance}}"), q("kdelay_replica_release_held")],
        "s",
        description="Wall clock minus the broker's; 1 = releases held (KdelayReleaseHeld).",
    ),
    Panel(
        "Invalid buffer records",
        [errs("kdelay_replica_invalid_records_total", "instance", "reason", fn="increase")],
        "short",
        description="Buffer records a replica could not decode or store; the master "
        "dead-letters them (alert KdelayInvalidBufferRecords).",
    ),
    Panel(
        "Thread failures",
        [errs("kdelay_component_failures_total", "instance", "component", fn="increase")],
        "short",
        description="Unexpected exceptions that ended a supervised thread; it was restarted "
        "after a backoff (alert KdelayComponentFailing).",
    ),
    Panel(
        "Master step-downs",
        [errs("kdelay_replica_step_downs_total", "instance", "reason", fn="increase")],
        "short",
        description="A master gave the mastership up: clock_skew (it held its releases for "
        "--skew-step-down-ms while another replica stood), forwarder_failed.",
    ),
    Panel(
        "Held targets and records in flight",
        [
            q("kdelay_replica_targets_held", "{{instance}} targets held"),
            q("kdelay_replica_in_flight_messages", "{{instance}} in flight"),
            q("kdelay_replica_release_throttled_topics", "{{instance}} topics throttled"),
        ],
        "short",
        description="Master only. Targets (topic, partition) that get no new records: records "
        "in flight or a retry backoff after a failure; a failing target holds only itself. "
        "Topics throttled: target topics whose release rate limit held due messages back.",
    ),
    Panel(
        "Release smoothing: throttled releases and limits",
        [
            by("kdelay_replica_release_throttled_total", "topic", legend="{{topic}} throttled"),
            q(
                f"max by (topic) (kdelay_replica_release_rate_limit and {MASTER})",
                "{{topic}} limit",
            ),
        ],
        "rps",
        description="Per target topic: messages released late because its release rate limit "
        'held them back, and the limit itself (topic "*": --release-rate-limit, every topic '
        "without its own). A topic throttled for long needs a higher limit or fewer messages "
        "due at once.",
    ),
    Panel(
        "Dead-letter write errors",
        [errs("kdelay_replica_dead_letter_errors_total", "instance", "error")],
        "rps",
        description="Writes to the dead-letter topic that failed; the entry backs off and is "
        "tried again.",
    ),
]

PROXY = [
    Panel(
        "Kafka requests",
        [by("kdelay_proxy_requests_total", "api", "result")],
        "reqps",
    ),
    Panel(
        "Produce latency",
        [
            q(
                f"histogram_quantile({p}, sum by (le, path) "
                f"(rate(kdelay_proxy_produce_latency_seconds_bucket[{RATE}])))",
                f"{{{{path}}}} p{round(p * 100)}",
            )
            for p in (0.5, 0.99)
        ],
        "s",
    ),
    Panel("Open connections", [q("sum(kdelay_proxy_connections)", "connections")], "short"),
    Panel(
        "SASL logins",
        [
            by("kdelay_proxy_authentications_total", "mechanism", "kind"),
            errs(
                "kdelay_proxy_auth_failures_total",
                "mechanism",
                "reason",
                legend="failed {{mechanism}} {{reason}}",
            ),
        ],
        "rps",
        description="Logins on the Kafka listener (login, or KIP-368 reauthentication) and "
        "failures by reason (invalid_credentials: Kafka refused them); each failure is "
        "answered after a wait per address (auth_failure_delay_ms, doubling).",
    ),
    Panel(
        "Rejected records",
        [q(f'sum(rate(kdelay_proxy_records_total{{kind="rejected"}}[{RATE}]))', "rejected")],
        "rps",
        description="Batches refused with INVALID_RECORD (bad or conflicting kdelay headers).",
    ),
    Panel(
        "Rejected records by reason",
        [errs("kdelay_proxy_records_rejected_total", "reason")],
        "rps",
        description="Records refused, by limit setting (max_headers, ...) or invalid_record, "
        "invalid_batch, producer_state (README: Limits).",
    ),
    Panel(
        "Idempotent producer state",
        [
            q("sum(kdelay_proxy_producer_states)", "producers tracked"),
            errs("kdelay_proxy_producer_evictions_total", "reason", legend="evicted {{reason}}"),
        ],
        "short",
        description="Producers whose sequence numbers the proxy keeps, and those forgotten "
        "(idle past producer_state_ttl_s, or beyond max_producer_states).",
    ),
    Panel(
        "Kafka request errors",
        [by('kdelay_proxy_requests_total{result!="ok"}', "api", "result")],
        "reqps",
    ),
    Panel(
        "Upstream errors",
        [errs("kdelay_proxy_upstream_errors_total", "error")],
        "rps",
    ),
    Panel(
        "Upstream available",
        [q("kdelay_proxy_upstream_available", "{{instance}}")],
        "none",
        description="1 while upstream Kafka answers; 0 from a failed metadata request until it "
        "answers again: /readyz is 503 meanwhile (alert KdelayProxyUpstreamDown).",
    ),
    Panel(
        "Request memory",
        [
            q("kdelay_proxy_buffered_request_bytes", "{{instance}} buffered"),
            q("kdelay_proxy_buffered_request_limit_bytes", "{{instance}} limit"),
        ],
        "bytes",
        description="Request bytes held in memory, all connections and HTTP requests together, "
        "against max_buffered_request_bytes (README: Limits).",
    ),
    Panel(
        "Waiting for request memory",
        [q("kdelay_proxy_buffered_request_waiting", "{{instance}}")],
        "short",
        description="Connections and HTTP requests waiting, unread, for their request to fit "
        "in max_buffered_request_bytes: backpressure on those clients.",
    ),
    Panel(
        "HTTP API requests",
        [by("kdelay_proxy_http_requests_total", "route", "status")],
        "reqps",
    ),
    Panel(
        "Bytes",
        [by("kdelay_proxy_bytes_total", "direction")],
        "Bps",
    ),
]


DASHBOARDS: dict[str, Dashboard] = {
    "kdelay-overview.json": dashboard(
        "kdelay-overview", "kdelay / Overview", OVERVIEW, "Flow, backlog, lateness and errors."
    ),
    "kdelay-replicas.json": dashboard(
        "kdelay-replicas", "kdelay / Replicas", REPLICAS, "Delay-service replicas."
    ),
    "kdelay-proxy.json": dashboard("kdelay-proxy", "kdelay / Proxy", PROXY, "The Kafka proxy."),
}
