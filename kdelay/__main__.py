"""``python -m kdelay`` is the ``kdelay`` command."""

from __future__ import annotations

from kdelay.commands import main

main()
