"""``immutable``: the decorator of the immutable records built once per message on hot paths.

A ``@dataclass(frozen=True)`` sets each field through ``object.__setattr__`` in ``__init__``,
several times slower than a plain slotted dataclass, and the delay service builds several such
records per released message (the decoded message, its entry, the completion, its fate, the
tombstone). ``immutable`` builds the plain
slotted class at run time and declares it frozen to type checkers (PEP 681's
``frozen_default``), so ``mypy --strict`` still refuses any assignment to a field; it keeps
equality and hashing by value (``unsafe_hash``), as a frozen dataclass has them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar, dataclass_transform

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def immutable(cls: type[_T]) -> type[_T]:
    """Make ``cls`` an immutable value type (see the module docstring)."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
