"""What becomes of a record, the same for both listeners.

``route.py`` classifies each record (immediate, delayed, cancel), ``buffer_keys.py`` a buffer
record's key and acceptance order, ``cancel_acks.py`` when a cancel may be acknowledged,
``internal_topics.py`` the topics no client may write, ``topics.py`` the upstream topic cache
and the Metadata the proxy answers.
"""
