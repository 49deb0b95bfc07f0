"""The Kafka listener: what producers connect to.

``server.py`` accepts connections, ``connection.py`` reads and answers one connection's
requests (its SASL login in ``auth_session.py``, with what a listener's sessions share in
``auth_settings.py`` and the answers the proxy builds itself in ``sasl_answers.py``),
``broker.py`` answers each Kafka API, ``batch_routing.py`` a Produce partition's batch,
``idempotence.py`` idempotent producers' sequences, ``refusals.py`` the answers to consumers
and transactional producers.
"""
