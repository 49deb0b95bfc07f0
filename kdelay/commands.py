"""The ``kdelay`` command line (CONTRACT.md).

Subcommands live with their component and are imported lazily, by name, only when invoked:
``kdelay --version`` stays instant, and one component's dependencies never load another's.
A component provides a ``click.Command`` at the path registered in ``SUBCOMMANDS``.

``kdelay up`` is the development stack (``dev/``), which the wheel does not ship: it runs from a
checkout (found beside this package, as in the editable install ``make install`` makes), and an
installed wheel answers with the commands that get one. The stack is a harness for trying kdelay
and for its tests (local Kafka and ZooKeeper from pinned jars, restarts, a lock on its data
directory); production runs the components under Kubernetes (helm/) or Compose (deploy/docker).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from kdelay import __version__
from kdelay.errors import KdelayError

#: name -> "module:attribute" of a click.Command.
SUBCOMMANDS: dict[str, str] = {
    "up": "dev.up:command",
    "spark": "dev.spark:command",
    "proxy": "kdelay.proxy.cli:command",
    "send": "kdelay.proxy.client:send_command",
    "cancel": "kdelay.proxy.client:cancel_command",
    "delay-service": "kdelay.delay_service.cli:command",
    "status": "kdelay.delay_service.cli:status_command",
    "list": "kdelay.delay_service.cli:list_command",
    "reshard": "kdelay.delay_service.reshard.cli:reshard_command",
    "verify": "kdelay.verifier.cli:command",
    "jvm": "kdelay.commands:jvm",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported when first used (click's lazy-loading pattern)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        if module_name.startswith("dev.") and not _find_checkout():
            return _unavailable(cmd_name, NO_CHECKOUT)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only the component's own module (or its package) missing means "not installed";
            # a dependency missing inside it is a real error and keeps its traceback.
            if exc.name and module_name.startswith(exc.name):
                why = f"this installation has no module {exc.name} (needed for {target})"
                return _unavailable(cmd_name, why)
            raise
        command = getattr(module, attr, None)
        if not isinstance(command, click.Command):
            return _unavailable(cmd_name, f"{target} is not a click command")
        return command


#: What ``kdelay up`` says where kdelay was installed from a wheel.
NO_CHECKOUT = (
    "it runs the development stack, which lives in kdelay's source checkout and is not part of "
    "the installed package; in a checkout run 'make install' and then '.venv/bin/kdelay up' "
    "(or 'make demo'). To run kdelay itself, start 'kdelay proxy' and 'kdelay delay-service' "
    "against your Kafka and ZooKeeper, or install the Helm chart (helm/kdelay)."
)


def _find_checkout() -> bool:
    """Put the checkout holding this package on ``sys.path`` if there is one (``dev/``)."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "dev" / "__init__.py").is_file():
        return False
    if str(root) not in sys.path:
        sys.path.append(str(root))
    return True


def _unavailable(name: str, why: str) -> click.Command:
    def run() -> None:
        raise click.UsageError(f"'kdelay {name}' is not available: {why}")

    return click.Command(name, callback=run, help=f"(not available: {why})")


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
)
@click.version_option(__version__, prog_name="kdelay")
def cli() -> None:
    """Delayed and scheduled messages for Apache Kafka."""


@click.group()
def jvm() -> None:
    """The pinned Kafka, ZooKeeper and Spark-Kafka jars (from Maven Central)."""


@jvm.command("fetch")
@click.argument("components", nargs=-1)
def jvm_fetch(components: tuple[str, ...]) -> None:
    """Resolve the pinned jars into the cache (all components unless named)."""
    from kdelay import jars

    jars.main(components)


def main() -> None:
    """Console-script entry point: KdelayError becomes a one-line message and exit code 2."""
    try:
        code = cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except KdelayError as exc:
        click.echo(f"kdelay: error: {exc}", err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
