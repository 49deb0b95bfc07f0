"""Ingest: the buffer topic read into the store, on every replica.

Modules: ``ingest`` (the consumer loop), ``batch`` (one polled batch decoded and applied) and
``poison`` (records that cannot be stored).
"""
