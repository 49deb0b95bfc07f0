"""Command-line options generated from a component's settings model: a setting is declared once.

:func:`config_options` turns every field of a ``pydantic_settings.BaseSettings`` model into a
``click`` option (``buffer_topic`` -> ``--buffer-topic``) whose help is the field's
``description`` and whose default is shown from the model. Every option defaults to ``None``,
which :func:`kdelay.config_loader.load` reads as "not given", so the precedence flags >
environment > file > defaults holds and validation stays in the model (errors name the
setting).

Fields whose type has no natural one-word spelling on a command line (mappings, tuples) get no
flag; they are set through ``KDELAY_*`` variables or the config file, and the help says so.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

F = TypeVar("F", bound=Callable[..., Any])

_SCALARS: dict[type, click.ParamType[Any, Any]] = {
    str: click.STRING,
    int: click.INT,
    float: click.FLOAT,
    Path: click.Path(path_type=Path),
}


def _scalar(annotation: object) -> type | None:
    """The one scalar type behind ``T`` or ``T | None``; None for anything else."""
    if isinstance(annotation, type):
        return annotation if annotation in _SCALARS or annotation is bool else None
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _scalar(args[0])
    return None


def _default_text(info: FieldInfo) -> str | None:
    if info.default_factory is not None:
        return None  # computed at start-up (e.g. the host name): the description says what
    if info.is_required() or info.default in (None, ""):
        return None
    if isinstance(info.default, bool):
        return "yes" if info.default else "no"
    return str(info.default)


def _option(name: str, info: FieldInfo) -> Callable[[F], F] | None:
    kind = _scalar(info.annotation)
    if kind is None:
        return None
    flag = "--" + name.replace("_", "-")
    help_text = info.description or name.replace("_", " ")
    default = _default_text(info)
    if default is not None:
        help_text = f"{help_text} [{default}]"
    if kind is bool:
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=None, help=help_text)
    return click.option(flag, name, type=_SCALARS[kind], default=None, help=help_text)


def config_options(model: type[BaseSettings]) -> Callable[[F], F]:
    """Decorate a click command with one option per scalar setting of ``model``."""
    options = [
        opt for name, info in model.model_fields.items() if (opt := _option(name, info)) is not None
    ]

    def decorate(func: F) -> F:
        # click lists options in decoration order reversed; keep the model's order in --help.
        for opt in reversed(options):
            func = opt(func)
        return func

    return decorate


def unflagged(model: type[BaseSettings]) -> list[str]:
    """Settings that have no flag (set them through the environment or the config file)."""
    return [name for name, info in model.model_fields.items() if _option(name, info) is None]
