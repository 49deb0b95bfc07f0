"""A listing's filters as the replicas take them (``GET /v1/messages?state=pending...``,
CONTRACT.md v3): built once for ``kdelay list`` (delay_service/cli.py) and the proxy's listing
(proxy/http/queries.py)."""

from __future__ import annotations

from kdelay.errors import InvalidHeaderError
from kdelay.headers import parse_deliver_at


def listing_filters(
    topic: str | None, id_prefix: str | None, due_before: str | None
) -> dict[str, str]:
    """The replicas' listing parameters of a listing's filters (``kdelay list``, the proxy's
    ``GET /v1/messages``); ValueError saying why ``due_before`` is neither epoch milliseconds
    nor RFC 3339."""
    params: dict[str, str] = {}
    if topic:
        params["topic"] = topic
    if id_prefix:
        params["id_prefix"] = id_prefix
    if due_before:
        try:
            params["due_before"] = str(parse_deliver_at("due_before", due_before.encode()))
        except InvalidHeaderError as exc:
            raise ValueError(exc.problem) from None
    return params
