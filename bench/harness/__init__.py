"""What the benchmarks share; no entry points here (those are ``bench/<name>.py``).

A bench module imports from this package and never from another bench: ``bench.<name>`` is
only ever run (``python -m bench.<name>``). Nothing here imports ``tests``; the local stack
comes from ``dev.stack`` and ``dev.kafka_tools``.

- ``replicas``: delay-service replicas as subprocesses of one replica set, their metrics, RSS
  and CPU; ``PARTITIONS`` of the benches' buffer and target topics, the steady-rate broker.
- ``proxy_process``: a ``kdelay proxy`` subprocess (its pid for RSS, extra settings), and a
  local Kafka unless one is given.
- ``lateness``: buffer records produced straight to the buffer topic, paced, and their
  releases read back as lateness; the plain-Kafka baseline of the same schedule.
- ``release_floor``: the least a releaser does on plain Kafka, the floor under
  ``bench.delay_service``'s lateness.
- ``buffer_messages``: buffer records as confluent-kafka ``Message`` objects in ingest's
  batches, without Kafka (``bench.ingest_cpu``, ``bench.follower_removal``).
- ``cpu_count``: the per-record CPU benches' child processes and command line (CPU time, or
  instructions under callgrind).
- ``retry_consumer``: the retry helper benches' topics and consumer group.
- ``faults``, ``verdict``, ``clock_skew``: ``bench.reliability``'s deployment and fault
  injections, its judging and table, and a process whose wall clock is off.
"""
