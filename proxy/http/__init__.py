"""The HTTP API (CONTRACT.md) and the operator's console.

``app.py`` builds the FastAPI application; the routes are ``messages.py`` (schedule, replace;
a posted message's body and buffer record in ``message_records.py``), ``cancels.py``
(confirmed and bulk cancels, waiting in ``cancel_wait.py``), ``queries.py`` and ``cluster.py``
(what the replicas answer); ``console.py`` serves ``console/`` at ``/ui/``. Authentication:
``authenticate.py`` (the middleware, which paths need credentials), ``login.py`` (credentials
turned into a login to Kafka, read by ``credentials.py``), ``auth.py`` (the caller routes act
for); ``body.py`` request bodies, ``errors.py`` the error shape and statuses.
"""
