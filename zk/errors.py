"""Errors of the ZooKeeper coordination layer, under kdelay's one root."""

from __future__ import annotations

from typing import cast

from kdelay.errors import KdelayError


class CoordinationError(KdelayError):
    """ZooKeeper could not be reached or answered unexpectedly."""


class FencedError(CoordinationError):
    """A checkpoint write was rejected: another master holds a newer epoch."""


def zk_errors() -> tuple[type[Exception], ...]:
    """The exceptions a kazoo call raises when ZooKeeper is unreachable or says no."""
    from kazoo.exceptions import KazooException
    from kazoo.handlers.threading import KazooTimeoutError

    return (KazooException, KazooTimeoutError)


def no_auth_error() -> type[Exception]:
    """The exception a kazoo call raises when ZooKeeper refuses this session's credentials."""
    from kazoo.exceptions import NoAuthError

    return cast("type[Exception]", NoAuthError)
