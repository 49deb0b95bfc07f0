"""Release: what the master does with due messages, and every produce to Kafka.

Modules: ``forwarder`` (the master loop; ``forwarder_control`` what other threads ask of it),
``round`` (planning a round), ``sweep`` (a pass over held targets), ``smoothing``,
``owner_acls`` (an owner's WRITE, asked of Kafka before a release; ``acl_rules`` Kafka's rule),
``backoff`` (retry backoff and dead-letter policy), ``delivery_reports`` (settling what
completed), ``sender`` (every produce: ``producer``, ``in_flight``, ``series``), ``txn_sender``
and ``exactly_once`` (transactional releases; ``takeover`` fences the previous master),
``broker_clock`` (the broker's time), ``skew_step_down`` and ``follower_checkpoints``.
"""
