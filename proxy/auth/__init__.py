"""Logins and what a principal may do, for both listeners.

``broker_link.py`` a connection to a broker authenticated as the client, ``sasl_client.py``
the proxy as a SASL client, ``saslprep.py`` user names prepared as SCRAM does, ``jwks.py``
bearer tokens; ``authorization.py`` what a principal may do (asked of Kafka), ``owners.py``
who owns a message, ``upstream_acls.py`` the proxy's own ACLs checked at start; before login,
``prelogin.py`` (connections not logged in), ``login_gate.py`` (logins at once) and
``login_backoff.py`` (the wait after a failed login).
"""
