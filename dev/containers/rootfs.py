"""The Debian base image, made with debootstrap from the mirror the machine's apt uses.

No registry is involved: ``debootstrap --variant=minbase`` installs Debian's own packages into a
directory under ``.cache/containers``, which is cleaned the way Debian's official images are
(no package lists, caches, docs or man pages; ``policy-rc.d`` so no service starts in a build)
and imported as an image (``podman import``). Every other image kdelay builds starts from it
(dev/images/base/Dockerfile).

The image trusts what the machine trusts beyond Debian's CA bundle: the certificates in
/usr/local/share/ca-certificates are copied in, so pip, apt and Maven in the builds reach their
registries through a TLS-inspecting proxy as the machine does. Its label ``io.kdelay.inputs``
digests everything it is made from (suite, mirrors, packages, those certificates, this recipe):
an image whose label matches is up to date and not made again.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from dev.containers.engine import Engine, cache_dir
from kdelay.errors import InfrastructureError

SUITE = "bookworm"
INCLUDE = ("ca-certificates",)
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_SECURITY = "http://deb.debian.org/debian-security"
#: Bump when :func:`build` changes what it makes: the inputs digest then differs.
RECIPE = "1"
INPUTS_LABEL = "io.kdelay.inputs"

_APT_CLEAN = """\
// As Debian's official images: no .deb kept after an install, no translations.
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
"""
_DPKG_EXCLUDES = """\
# As Debian's slim images: no documentation in images.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
"""


def _entries(apt: Path) -> list[tuple[str, list[str]]]:
    """(URI, suites) of every ``deb`` source in apt's one-line and deb822 files."""
    files = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]
    found: list[tuple[str, list[str]]] = []
    for path in files:
        if not path.is_file():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            fields = re.sub(r"\[[^]]*\]", " ", raw.split("#", 1)[0]).split()
            if len(fields) >= 3 and fields[0] == "deb":
                found.append((fields[1], [fields[2]]))
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
        if not path.is_file():
            continue
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            keys: dict[str, str] = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith(("#", " ")):
                    key, _, value = line.partition(":")
                    keys[key.strip().lower()] = value.strip()
            if "deb" in keys.get("types", "").split() and keys.get("enabled", "yes") != "no":
                for uri in keys.get("uris", "").split():
                    found.append((uri, keys.get("suites", "").split()))
    return found


def mirrors(apt: Path = Path("/etc/apt")) -> tuple[str, str]:
    """The Debian mirror and the security mirror the machine's apt uses for :data:`SUITE`."""
    main = security = ""
    for uri, suites in _entries(apt):
        if not main and SUITE in suites:
            main = uri.rstrip("/")
        if not security and f"{SUITE}-security" in suites:
            security = uri.rstrip("/")
    return main or DEFAULT_MIRROR, security or DEFAULT_SECURITY


def _cas() -> list[Path]:
    return sorted(LOCAL_CAS.rglob("*.crt")) if LOCAL_CAS.is_dir() else []


def inputs() -> str:
    """The digest of everything the base image is made from."""
    main, security = mirrors()
    digest = hashlib.sha256()
    for part in (RECIPE, SUITE, main, security, " ".join(INCLUDE), _APT_CLEAN, _DPKG_EXCLUDES):
        digest.update(part.encode() + b"\0")
    for ca in _cas():
        digest.update(ca.name.encode() + b"\0" + ca.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _sources(main: str, security: str) -> str:
    return (
        f"deb {main} {SUITE} main\n"
        f"deb {main} {SUITE}-updates main\n"
        f"deb {security} {SUITE}-security main\n"
    )


def _run(argv: list[str], log: Path, show: Callable[[str], None] | None = None) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            if show is not None:
                show(line.rstrip())
        code = proc.wait()
    if code != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise InfrastructureError(f"{argv[0]} failed ({code}); log {log}:\n{tail}")


#: debootstrap's stage lines worth showing (not one line per package).
_STAGES = re.compile(
    r"^I: (Retrieving Release|Checking component|Resolving|Installing|Unpacking required"
    r"|Configuring required|Unpacking the base|Configuring the base|Base system)"
)


def build(engine: Engine, name: str, digest: str, log: Path, show: Callable[[str], None]) -> None:
    """debootstrap the base system and import it into the engine as ``name``."""
    if shutil.which("debootstrap") is None:
        raise InfrastructureError("debootstrap is missing: apt-get install debootstrap")
    main, security = mirrors()
    root = cache_dir() / "rootfs" / SUITE
    debs = cache_dir() / "debs"
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    debs.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    show(f"debootstrap --variant=minbase {SUITE} from {main}")
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(INCLUDE)}",
            f"--cache-dir={debs}",
            SUITE,
            str(root),
            main,
        ],
        log,
        lambda line: show(line[3:]) if _STAGES.match(line) else None,
    )
    (root / "etc/apt/sources.list").write_text(_sources(main, security))
    (root / "etc/apt/apt.conf.d/docker-clean").write_text(_APT_CLEAN)
    (root / "etc/dpkg/dpkg.cfg.d/docker-excludes").write_text(_DPKG_EXCLUDES)
    policy = root / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\n# No service starts inside an image build.\nexit 101\n")
    policy.chmod(0o755)
    cas = _cas()
    if cas:
        target = root / "usr/local/share/ca-certificates"
        target.mkdir(parents=True, exist_ok=True)
        for ca in cas:
            shutil.copyfile(ca, target / ca.name)
        _run(["chroot", str(root), "update-ca-certificates"], log)
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/man"):
        for child in (root / junk).glob("*"):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    show(f"importing the root file system as {name}")
    tar = subprocess.Popen(
        ["tar", "-C", str(root), "--numeric-owner", "-c", "."],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        result = subprocess.run(
            [
                *engine.cli,
                "import",
                "--change",
                'CMD ["bash"]',
                "--change",
                f"LABEL {INPUTS_LABEL}={digest}",
                "-",
                name,
            ],
            stdin=tar.stdout,
            env=engine.env(),
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
    finally:
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait()
    if result.returncode != 0 or tar.returncode != 0:
        raise InfrastructureError(f"importing {root} as {name} failed: {result.stderr.strip()}")
    shutil.rmtree(root, ignore_errors=True)
