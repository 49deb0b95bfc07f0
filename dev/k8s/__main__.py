"""``python -m dev.k8s up|down|status|env|kafka-zookeeper|supervise`` (make k8s-up, k8s-down).

``kafka-zookeeper`` starts Kafka and ZooKeeper in the cluster for the chart (dev.k8s.infra).
"""

from __future__ import annotations

import argparse
import sys

from dev.containers.progress import say
from dev.k8s import cluster, daemon, infra
from dev.k8s.settings import layout
from kdelay.errors import KdelayError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.k8s", description=__doc__)
    parser.add_argument(
        "command", choices=["up", "down", "status", "env", "kafka-zookeeper", "supervise"]
    )
    args = parser.parse_args(argv)
    lay = layout()
    try:
        if args.command == "up":
            cluster.up(lay)
        elif args.command == "down":
            cluster.down(lay)
        elif args.command == "status":
            return cluster.status(lay)
        elif args.command == "kafka-zookeeper":
            infra.apply(lay)
            say(f"kafka {infra.BOOTSTRAP}  zookeeper {infra.ZK_CONNECT}")
        elif args.command == "env":
            say(f"export KUBECONFIG={lay.kubeconfig}")
            say(f"export PATH={lay.bin('kubectl').parent}:{lay.helm.parent}:$PATH")
        else:
            return daemon.main()
    except KdelayError as exc:
        print(f"dev.k8s: error: {exc}", file=sys.stderr)  # noqa: T201 - the CLI's error line
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
