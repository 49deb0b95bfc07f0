"""SASLprep (RFC 4013) of the user names the HTTP API logs in to Kafka with.

The HTTP API's principal must be the name Kafka authenticated, or one Kafka user could act under
another's name at the proxy (its ACL answers cached under that name, its messages owned by it).
For ``Authorization: Basic`` the proxy logs in with scramp, which SASLpreps the user name it
sends in SCRAM's client-first message (RFC 5802 section 5.1); Kafka then authenticates that
prepared name as it is (Kafka's ``ScramFormatter`` only unescapes ``=2C`` and ``=3D``). So the
HTTP principal is the prepared name, and PLAIN logins send the prepared name too: ``alice`` and
``alice\\u00ad`` (a soft hyphen, mapped to nothing) are one principal, ``User:alice``, on either
mechanism. A name SASLprep refuses (control characters, unassigned code points, a malformed
bidirectional string) cannot log in.

The Kafka listener does not prepare names: there the client's own library decides what it
sends, and the principal is what its first token names, as Kafka reads it
(proxy/kafka/auth_session.py).

The algorithm is scramp's (``scramp.utils.saslprep``): the one that prepares what is sent, so
the principal and the login cannot disagree. Pure functions.
"""

from __future__ import annotations

from typing import Final

from scramp import ScramException
from scramp.utils import saslprep as _scramp_saslprep

from kdelay.errors import KdelayError

#: Why a name is refused, by scramp's message: the message names a class of character, never
#: the name (which is client input).
_WHY: Final = "it holds a character SASLprep (RFC 4013) prohibits"


class InvalidNameError(KdelayError):
    """A user name SASLprep refuses; the message says why without quoting the name."""


def saslprep(name: str) -> str:
    """``name`` prepared by SASLprep (RFC 4013: map, NFKC, prohibit, check bidi); raises
    InvalidNameError for a name it prohibits or that prepares to nothing."""
    try:
        prepared = str(_scramp_saslprep(name))
    except ScramException as exc:
        reason = str(exc.args[0]) if exc.args else _WHY
        raise InvalidNameError(f"the user name is not valid under SASLprep: {reason}") from None
    if not prepared:
        raise InvalidNameError("the user name is empty under SASLprep (RFC 4013)")
    return prepared
