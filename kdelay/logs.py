"""Structured logging: JSON lines (or a readable console form) through structlog.

Event names are ``<component>.<event>`` in snake case (``ingest.caught_up``,
``forwarder.checkpoint_rejected``, ``proxy.batch_rejected``); what varies goes into fields
(``id=...``, ``error=...``), never into the event text, so operators and tests match on
``event`` and fields instead of prose.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "INFO", *, json: bool = True) -> None:
    """Route structlog and stdlib logging to stderr as JSON lines (or console text)."""
    numeric = logging.getLevelNamesMapping().get(level.upper())
    if numeric is None:
        raise ValueError(f"log level {level!r} is not one of DEBUG, INFO, WARNING, ERROR")
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(numeric)
    for noisy in ("kazoo.client", "kafka", "py4j"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))


def get(name: str) -> structlog.stdlib.BoundLogger:
    """A structured logger named for its module."""
    return structlog.stdlib.get_logger(name)
