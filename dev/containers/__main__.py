"""``python -m dev.containers``: what ``make containers`` and ``make containers-down`` run.

up [--only IMAGE ...] [--force] [--no-service]   engine, configuration, API socket, images
down                                             the tests' and the demo's containers, socket
status                                           engine, socket, every image
env                                              shell exports for the docker CLI
demo-compose [--keep]                            compose.yaml, the demo burst, its SLO
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys

from dev.containers import compose, docker_api, engine, images, podman_setup, rootfs
from dev.containers.progress import Steps, say
from kdelay.errors import KdelayError


def _prepare_engine(steps: Steps, *, service: bool) -> engine.Engine:
    eng = engine.detect()
    if eng.kind == "docker":
        say(f"==> using the Docker Engine at {eng.docker_host}")
        return eng
    with steps.step(f"engine packages ({', '.join(podman_setup.PACKAGES)})") as step:
        missing = podman_setup.missing_packages()
        podman_setup.install_packages(missing)
        step.outcome = f"apt-get installed {' '.join(missing)}" if missing else "installed already"
    with steps.step("podman configuration (.kdelay/containers)"):
        podman_setup.write_config()
    if service:
        with steps.step("Docker API socket (podman system service)") as step:
            step.outcome = docker_api.start_service()
    return eng


def _build_images(eng: engine.Engine, steps: Steps, only: list[str], *, force: bool) -> None:
    recipes = images.recipes()
    catalogue = images.catalogue()
    for image in images.selected(only or None):
        if not image.local:
            how = "not buildable here" if not image.buildable else f"${image.variable}"
            say(f"==> {image.key}: {image.name} ({how}; the engine pulls it on first use)")
            continue
        log = images.logs_dir() / f"{image.key}.log"
        with steps.step(f"image {image.name}: {image.what}") as step:

            def show(line: str) -> None:
                say(f"    {line}")

            if image.key == "debian":
                digest = rootfs.inputs()
                if not force and eng.image_label(image.name, images.INPUTS_LABEL) == digest:
                    step.outcome = "up to date"
                    continue
                rootfs.build(eng, image.name, digest, log, show)
                step.outcome = "built"
                continue
            parent = catalogue[image.parent] if image.parent else None
            plan = images.plan(eng, image, recipes[image.key], parent)
            if not force and eng.image_label(image.name, images.INPUTS_LABEL) == plan.digest:
                step.outcome = "up to date"
                continue
            images.build(eng, plan, log, show)
            step.outcome = "built"


def up(args: argparse.Namespace) -> int:
    steps = Steps("make containers")
    try:
        eng = _prepare_engine(steps, service=not args.no_service)
        if eng.kind == "podman":
            engine.remove_orphans(eng)
        _build_images(eng, steps, args.only, force=args.force)
        # Superseded builds of these images (untagged now); build-stage layers stay cached.
        eng.run("image", "prune", "-f", "--filter", f"label={images.INPUTS_LABEL}", check=False)
    finally:
        say(steps.summary())
        steps.save(engine.state_dir() / "timings.jsonl")
    say('containers ready; the docker CLI: eval "$(.venv/bin/python -m dev.containers env)"')
    return 0


def down(_args: argparse.Namespace) -> int:
    eng = engine.detect()
    if eng.kind == "podman" and shutil.which("podman") is None:
        say("podman is not installed: no containers to remove")
        say(docker_api.stop_service())
        return 0
    if eng.kind == "podman":
        podman_setup.write_config()
    removed = compose.remove_project(eng)
    if removed:
        say(f"removed the Compose project's {len(removed)} container(s)/network/volume(s)")
    removed = engine.remove_orphans(eng, everything=True)
    if removed:
        say(f"removed {len(removed)} container(s)/network(s) the tests left")
    if eng.kind == "podman":
        say(docker_api.stop_service())
        for sock in docker_api.remove_stale_sockets():
            say(f"removed {sock.name}, the socket of a test run that was killed")
    return 0


def status(_args: argparse.Namespace) -> int:
    eng = engine.detect()
    say(f"engine: {eng.kind}, Docker API {eng.docker_host}")
    if eng.kind == "podman":
        missing = podman_setup.missing_packages()
        say(f"packages: {'missing ' + ' '.join(missing) if missing else 'installed'}")
        answers = docker_api.api_answers(engine.service_socket())
        say(f"socket: {'answers' if answers else 'not running'} ({engine.service_socket()})")
        if missing:
            return 1
    for image in images.catalogue().values():
        there = eng.image_exists(image.name)
        origin = (
            "built here"
            if image.local
            else f"${image.variable}"
            if image.buildable
            else "official image, never built here"
        )
        say(f"  {image.key:<11} {image.name:<40} {'present' if there else 'absent':<8} {origin}")
    return 0


def env(_args: argparse.Namespace) -> int:
    eng = engine.detect()
    for key, value in {**eng.client_env(), **images.names()}.items():
        print(f"export {key}={shlex.quote(value)}")  # noqa: T201 - for eval in a shell
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dev.containers", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="engine, configuration, API socket and images")
    p_up.add_argument("--only", nargs="*", default=[], help="build only these images (keys)")
    p_up.add_argument("--force", action="store_true", help="rebuild even when up to date")
    p_up.add_argument("--no-service", action="store_true", help="do not start the API socket")
    p_up.set_defaults(func=up)
    sub.add_parser("down", help="remove the containers, stop the socket").set_defaults(func=down)
    sub.add_parser("status", help="engine, socket and images").set_defaults(func=status)
    sub.add_parser("env", help="shell exports for the docker CLI").set_defaults(func=env)
    p_demo = sub.add_parser("demo-compose", help="start compose.yaml, send the demo burst")
    p_demo.add_argument("--keep", action="store_true", help="leave the stack running")
    p_demo.set_defaults(func=compose.demo)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KdelayError as exc:
        print(f"kdelay containers: error: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
