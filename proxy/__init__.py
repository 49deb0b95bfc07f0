"""The kdelay proxy: a Kafka broker facade for producers, and an HTTP API.

Records without kdelay headers pass straight through to their topic and partition; delayed
ones and cancels go to the buffer topic. See DESIGN.md and CONTRACT.md.
"""

from __future__ import annotations

from kdelay.proxy.app import Addresses, Proxy, running_proxy
from kdelay.proxy.config import ProxyConfig

__all__ = ["Addresses", "Proxy", "ProxyConfig", "running_proxy"]
