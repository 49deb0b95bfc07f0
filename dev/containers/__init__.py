"""kdelay in containers on this machine: the engine, the images, the Compose stack.

Development tooling (``make containers``, ``make containers-down``, ``make test-containers``,
``make demo-compose``; docs/containers.md); no runtime component imports it.

- :mod:`~dev.containers.engine`: which engine (a real Docker Engine where one answers, else
  podman), its CLI, and the removal of what the tests left behind;
- :mod:`~dev.containers.podman_setup`: Debian's podman packages and the project's own
  configuration files for it;
- :mod:`~dev.containers.docker_api`: podman's Docker API socket (the service ``make
  containers`` leaves running, or one per test session);
- :mod:`~dev.containers.rootfs`: the Debian base image, by debootstrap;
- :mod:`~dev.containers.images`: every image and its local build, rebuilt only when its
  inputs change;
- :mod:`~dev.containers.compose`: ``make demo-compose``, deploy/docker/compose.yaml started
  and checked against the demo's SLO.

``python -m dev.containers up|down|status|env`` is the command line the Makefile calls.
"""

from __future__ import annotations

from dev.containers.docker_api import api
from dev.containers.engine import LABEL, Engine, detect, remove_orphans
from dev.containers.images import Image, catalogue, names

__all__ = ["LABEL", "Engine", "Image", "api", "catalogue", "detect", "names", "remove_orphans"]
