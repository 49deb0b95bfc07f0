"""One exception tree: every exception class the product defines derives from
``kdelay.errors.KdelayError``, so a caller can catch what kdelay raises on purpose in one
place (a class may add a standard base too, e.g. ``ValueError`` or Starlette's
``HTTPException``, for the framework that handles it)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from kdelay.errors import KdelayError

PACKAGES = ["kdelay"]  # and its components, below it


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if not info.name.endswith("__main__"):
                names.append(info.name)
    return names


def test_every_exception_the_product_defines_is_a_kdelay_error() -> None:
    outside = []
    for name in _modules():
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if (
                inspect.isclass(obj)
                and issubclass(obj, BaseException)
                and obj.__module__ == name
                and not issubclass(obj, KdelayError)
            ):
                outside.append(f"{name}.{attr}")
    assert outside == []
