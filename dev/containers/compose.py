"""``make demo-compose``: deploy/docker/compose.yaml started, the demo's burst, the same SLO.

1. ``podman-compose`` (Debian's; or ``docker compose`` on a Docker Engine) starts the stack as
   project ``kdelay`` with the images ``make containers`` built (``KDELAY_*_IMAGE`` may name
   others). Grafana starts only when its image is there or can be pulled; otherwise the demo
   says so and goes on without it (no Grafana binary is reachable from this machine).
2. Every service's own healthcheck is run until it passes (podman runs healthchecks from
   systemd timers, and there is no systemd here, so ``podman healthcheck run`` does it), then
   ``kdelay status`` inside a replica must name a master.
3. The demo's burst (dev/demo.py: 5,000 messages, delays 0-10 s, every timing header) goes
   through the proxy's published port to LogAppendTime topics; the proxy's ``GET /v1/pending``
   (answered by a replica it finds in ZooKeeper) counts them; then the verifier *image*
   (``kdelay verify --once`` with the demo's SLO) judges them on the stack's network, and
   Prometheus (the local image, the project's rules) is asked which targets it scrapes.
4. ``compose down -v`` removes the stack unless ``--keep``. Exit status: the verifier's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

from dev import ROOT
from dev import demo as burst
from dev.containers import engine, images
from dev.containers.engine import Engine
from dev.containers.progress import Steps, say
from dev.stack.process import wait_until
from kdelay.errors import InfrastructureError

PROJECT = "kdelay"
COMPOSE = Path("deploy") / "docker" / "compose.yaml"
SERVICES = ("zookeeper", "kafka", "proxy", "replica-1", "replica-2", "replica-3", "prometheus")
PROXY = "127.0.0.1:19092"
KAFKA = "127.0.0.1:29092"
PROMETHEUS = "http://127.0.0.1:9090"
HTTP_API = "http://127.0.0.1:18080"
#: The compose project's labels (podman-compose's and Docker Compose's).
_PROJECT_LABELS = ("io.podman.compose.project", "com.docker.compose.project")


def _tool(eng: Engine) -> list[str]:
    file = str(ROOT / COMPOSE)
    if eng.kind == "podman":
        if shutil.which("podman-compose") is None:
            raise InfrastructureError("podman-compose is missing: run `make containers`")
        return ["podman-compose", "-p", PROJECT, "-f", file]
    return ["docker", "compose", "-p", PROJECT, "-f", file]


def _compose(eng: Engine, *args: str, log: Path, timeout: float = 600) -> None:
    env = {**eng.env(), **images.names()}
    with log.open("a") as out:
        out.write(f"$ {' '.join([*_tool(eng), *args])}\n")
        out.flush()
        result = subprocess.run(
            [*_tool(eng), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
            timeout=timeout,
            cwd=ROOT,
        )
    if result.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise InfrastructureError(f"compose {' '.join(args)} failed; log {log}:\n{tail}")


def _container(eng: Engine, service: str) -> str:
    """The id of ``service``'s container in the project."""
    ids = eng.run(
        "ps",
        "-a",
        "-q",
        "--filter",
        f"label=com.docker.compose.project={PROJECT}",  # podman-compose sets it too
        "--filter",
        f"label=com.docker.compose.service={service}",
    ).stdout.split()
    if not ids:
        raise InfrastructureError(f"compose started no container for {service}")
    return ids[0]


def _healthy(eng: Engine, container: str) -> bool:
    """The service's own healthcheck passes; a service without one: it is running."""
    state = json.loads(
        eng.run("inspect", "--format", "{{json .State}}", container, check=False).stdout or "{}"
    )
    if not state.get("Running"):
        return False
    check = eng.run("inspect", "--format", "{{json .Config.Healthcheck}}", container, check=False)
    if check.stdout.strip() in ("", "null", "<no value>"):
        return True
    if eng.kind == "podman":  # no systemd timers: run the service's healthcheck ourselves
        return eng.run("healthcheck", "run", container, check=False, timeout=60).returncode == 0
    return str((state.get("Health") or {}).get("Status")) == "healthy"


def remove_stack(eng: Engine) -> list[str]:
    """Remove the project's containers and their anonymous volumes (podman-compose 1.0's
    ``down -v`` leaves those); ``make containers-down`` runs it too."""
    removed: list[str] = []
    for label in _PROJECT_LABELS:
        found = eng.run(
            "ps", "-a", "-q", "--filter", f"label={label}={PROJECT}", check=False
        ).stdout.split()
        fresh = [c for c in found if c not in removed]
        if fresh:
            eng.run("rm", "-f", "-v", *fresh, check=False)
            removed += fresh
    return removed


def remove_project(eng: Engine) -> list[str]:
    """What ``compose down -v`` removes, without compose: the project's containers, network
    and named volumes (``make containers-down``)."""
    removed = remove_stack(eng)
    label = f"label=com.docker.compose.project={PROJECT}"
    for kind in ("network", "volume"):
        found = eng.run(kind, "ls", "-q", "--filter", label, check=False).stdout.split()
        if found:
            eng.run(kind, "rm", *found, check=False)
            removed += found
    return removed


def _grafana(eng: Engine, log: Path) -> str | None:
    """Grafana's image when it is there or can be pulled; None, said plainly, otherwise."""
    image = images.catalogue()["grafana"].name
    if eng.image_exists(image):
        return image
    first = image.split("/")[0]
    registry = "." in first or ":" in first or first == "localhost"
    pulled = eng.run("pull", image if registry else f"docker.io/{image}", check=False, timeout=120)
    if pulled.returncode == 0:
        return image
    with log.open("a") as out:
        out.write(pulled.stderr)
    reason = (pulled.stderr.strip().splitlines() or ["no reason given"])[-1]
    say(f"    grafana: NOT started: {image} cannot be pulled here ({reason[:160]})")
    say("    (no Grafana binary is reachable from here; the dashboards are in deploy/grafana)")
    return None


def _master(eng: Engine, replica: str) -> str | None:
    out = eng.run(
        "exec",
        replica,
        "kdelay",
        "status",
        "--zk-connect",
        "zookeeper:2181",
        "--zk-root",
        "/kdelay",
        "--json",
        check=False,
        timeout=60,
    )
    if out.returncode != 0:
        return None
    try:
        master = json.loads(out.stdout).get("master")
    except json.JSONDecodeError:
        return None
    return str(master) if master else None


def _verify(eng: Engine, work: Path, log: Path) -> int:
    """``kdelay verify --once`` from the verifier image, on the stack's network."""
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o777)  # the image runs as uid 10001
    argv = [
        "run",
        "--rm",
        "--network",
        f"{PROJECT}_default",
        "-v",
        f"{work}:/out",
        images.catalogue()["verifier"].name,
        "verify",
        "--once",
        "--bootstrap-servers",
        "kafka:9092",
        "--topics",
        ",".join(burst.TOPICS),
        "--output-dir",
        "/out/verifier",
        "--report",
        "/out/report.json",
        *[x for pair in burst.SLO.items() for x in pair],
    ]
    result = eng.run(*argv, check=False, timeout=900)
    with log.open("a") as out:
        out.write(result.stdout + result.stderr)
    report = work / "report.json"
    if report.exists():
        say(json.dumps(json.loads(report.read_text()), indent=2))
        say(f"report: {report}")
    else:
        say("\n".join(result.stderr.strip().splitlines()[-15:]))
    return result.returncode


def _prometheus() -> str:
    with urllib.request.urlopen(f"{PROMETHEUS}/api/v1/targets", timeout=5) as resp:  # noqa: S310
        targets = json.loads(resp.read())["data"]["activeTargets"]
    with urllib.request.urlopen(f"{PROMETHEUS}/api/v1/rules", timeout=5) as resp:  # noqa: S310
        groups = json.loads(resp.read())["data"]["groups"]
    up = sorted(t["labels"].get("instance", "?") for t in targets if t["health"] == "up")
    rules = sum(len(g["rules"]) for g in groups)
    return f"{len(up)}/{len(targets)} targets up ({', '.join(up)}); {rules} rules loaded"


def _pending() -> str:
    """The proxy's GET /v1/pending, which a replica answers through ZooKeeper."""
    url = f"{HTTP_API}/v1/pending?bucket=1s&horizon=1m"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        doc = json.loads(resp.read())
    return (
        f"{doc['pending']} pending, answered by {doc['answered_by']} ({doc['role']}), "
        f"{len(doc['buckets'])} one-second buckets"
    )


def _check_images(eng: Engine) -> None:
    needed = ("kdelay", "verifier", "kafka", "zookeeper", "prometheus")
    for image in images.catalogue().values():
        if image.local and image.key in needed and not eng.image_exists(image.name):
            raise InfrastructureError(f"{image.name} is not built: run `make containers`")


def _start(eng: Engine, steps: Steps, log: Path) -> None:
    with steps.step(f"compose up ({eng.kind}): {', '.join(SERVICES)}"):
        remove_stack(eng)
        _compose(eng, "up", "-d", *SERVICES, log=log)
    with steps.step("grafana") as step:
        grafana = _grafana(eng, log)
        if grafana is not None:
            _compose(eng, "up", "-d", "grafana", log=log)
        step.outcome = "started" if grafana else "not started (image unavailable)"


def _wait_ready(eng: Engine, steps: Steps) -> None:
    with steps.step("every service's healthcheck passes"):
        waiting = {s: _container(eng, s) for s in SERVICES}

        def healthy() -> bool:
            for service, container in list(waiting.items()):
                if _healthy(eng, container):
                    say(f"    {service} healthy")
                    del waiting[service]
            return not waiting

        try:
            wait_until(healthy, timeout=300, what="every healthcheck to pass", interval=2)
        except InfrastructureError as exc:
            raise InfrastructureError(f"{exc}; still failing: {', '.join(waiting)}") from exc
    with steps.step("a master elected (kdelay status in replica-1)") as step:
        replica = _container(eng, "replica-1")
        found: list[str] = []

        def elected() -> bool:
            master = _master(eng, replica)
            found.extend([master] if master else [])
            return master is not None

        wait_until(elected, timeout=180, what="a master in `kdelay status`", interval=1)
        step.outcome = f"master {found[-1]}"


def _burst_and_verify(eng: Engine, steps: Steps, work: Path, log: Path) -> int:
    with steps.step(f"the demo's {burst.MESSAGES} delayed messages through {PROXY}"):
        burst.create_topics(KAFKA)
        started = burst.send(PROXY)
    with steps.step("GET /v1/pending on the proxy's HTTP API (a replica answers)") as step:
        step.outcome = _pending()
    with steps.step("waiting for them to fall due and be delivered"):
        burst.wait_delivered(KAFKA, started + burst.MAX_DELAY_MS / 1000 + 60)
    with steps.step("kdelay verify --once (the verifier image)") as step:
        code = _verify(eng, work, log)
        step.outcome = "SLO met" if code == 0 else f"SLO MISSED (exit {code})"
    with steps.step("prometheus (Debian's, the project's rules)") as step:
        step.outcome = _prometheus()
    return code


def demo(args: argparse.Namespace) -> int:
    """``make demo-compose``; see the module docstring. Returns the verifier's exit status."""
    steps = Steps("make demo-compose")
    eng = engine.detect()
    work = engine.state_dir() / "demo-compose"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = work / "compose.log"
    _check_images(eng)
    code = 1
    try:
        _start(eng, steps, log)
        _wait_ready(eng, steps)
        code = _burst_and_verify(eng, steps, work, log)
    finally:
        if args.keep:
            say(f"==> the stack keeps running (project {PROJECT}); make containers-down stops it")
        else:
            with steps.step("compose down -v"):
                remove_stack(eng)  # first: with their anonymous volumes
                _compose(eng, "down", "-v", log=log)
                remove_project(eng)  # podman-compose 1.0 leaves the network
        say(steps.summary())
        steps.save(engine.state_dir() / "timings.jsonl")
    slo = ", ".join(f"{k} {v}" for k, v in burst.SLO.items())
    say(f"demo-compose: {'SLO met' if code == 0 else 'SLO MISSED'} ({slo}); log {log}")
    return code
