"""Secrets read from files (a mounted Kubernetes Secret), shared by every component's settings."""

from __future__ import annotations

from pathlib import Path


def read_secret_file(path: Path, setting: str) -> str:
    """The secret in ``path`` without its trailing newline; ValueError naming ``setting``
    (never the secret)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{setting}: cannot read {path}: {exc.strerror}") from None
    secret = text.rstrip("\r\n")
    if not secret:
        raise ValueError(f"{setting}: {path} is empty")
    return secret
