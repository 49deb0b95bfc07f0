"""kdelay in containers on this machine: the engine, the images, the Compose stack.

Development tooling (``make containers``, ``make containers-down``, ``make test-containers``,
``make demo-compose``; docs/containers.md); no runtime component imports it.

- :mod:`~dev.containers.engine`: Debian's podman with the project's own configuration and
  Docker API socket (or a real Docker Engine where one answers);
- :mod:`~dev.containers.rootfs`: the Debian base image, by debootstrap;
- :mod:`~dev.containers.images`: every image and its local build, rebuilt only when its
  inputs change;
- :mod:`~dev.containers.compose`: ``make demo-compose``, deploy/docker/compose.yaml started
  and checked against the demo's SLO.

``python -m dev.containers up|down|status|env`` is the command line the Makefile calls.
"""

from __future__ import annotations

from dev.containers.engine import LABEL, Engine, api, detect, remove_orphans
from dev.containers.images import Image, catalogue, names

__all__ = ["LABEL", "Engine", "Image", "api", "catalogue", "detect", "names", "remove_orphans"]
