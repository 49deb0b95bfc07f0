"""ZooKeeper coordination: election, membership registry and the fenced checkpoint store."""
