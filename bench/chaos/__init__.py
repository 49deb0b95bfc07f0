"""``python -m bench.chaos``: random operations and random faults against a local stack, judged
by a checker that shares no code with kdelay (CONTRACT.md, v4 additions).

- :mod:`bench.chaos.plan`: the seeded schedule of operations and faults (same seed, same run).
- :mod:`bench.chaos.operations`: producer threads and HTTP calls that carry out the
  operations and record the client-side history (:mod:`bench.chaos.history`).
- :mod:`bench.chaos.faults`: the nemesis, on :class:`bench.harness.faults.Cluster`.
- :mod:`bench.chaos.readback`: every target read back read_committed.
- :mod:`bench.chaos.checker`: the judge; it imports nothing of kdelay or the harness.

Nothing is imported here, so the checker's imports stay its own.
"""
