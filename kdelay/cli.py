"""The ``kdelay`` command line (CONTRACT.md). Subcommands import their component lazily, so
``kdelay --version`` stays instant and one component's dependencies never load another's."""

from __future__ import annotations

import sys

import click

from kdelay import __version__
from kdelay.errors import KdelayError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="kdelay")
def cli() -> None:
    """Delayed and scheduled messages for Apache Kafka."""


@cli.group()
def jvm() -> None:
    """The pinned Kafka, ZooKeeper and Spark-Kafka jars (from Maven Central)."""


@jvm.command("fetch")
@click.argument("components", nargs=-1)
def jvm_fetch(components: tuple[str, ...]) -> None:
    """Resolve the pinned jars into the cache (all components unless named)."""
    from kdelay.local import jvm as jvm_mod

    for name in components or jvm_mod.COMPONENTS:
        path = jvm_mod.jars(name, progress=True)
        click.echo(f"{name} {jvm_mod.pinned_version(name)}: {path}")


def main() -> None:
    """Console-script entry point: KdelayError becomes a one-line message and exit code 2."""
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KdelayError as exc:
        click.echo(f"kdelay: error: {exc}", err=True)
        sys.exit(2)
