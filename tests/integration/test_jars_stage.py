"""The image's jar stage runs kdelay's resolver from only the files it copies, in a Python
without site-packages (a real interpreter process, hence integration)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kdelay import jars


def test_the_image_jar_stage_runs_the_resolver_from_the_files_it_copies(tmp_path: Path) -> None:
    """deploy/docker/Dockerfile's jar stage copies a few kdelay files and the pom, then runs
    ``python -m kdelay.jars`` without kdelay's dependencies: those files must suffice."""
    root = Path(__file__).resolve().parents[2]
    dockerfile = (root / "deploy/docker/Dockerfile").read_text()
    copied = re.search(r"^COPY ((?:kdelay/\S+ )+)\./kdelay/$", dockerfile, re.M)
    assert copied, "the jar stage no longer copies kdelay's resolver"
    (tmp_path / "kdelay").mkdir()
    for name in copied.group(1).split():
        (tmp_path / name).write_bytes((root / name).read_bytes())
    (tmp_path / "kdelay/jvm/spark-kafka").mkdir(parents=True)
    for name in ("kdelay/jvm/settings.xml", "kdelay/jvm/spark-kafka/pom.xml"):
        (tmp_path / name).write_bytes((root / name).read_bytes())
    probe = "from kdelay import jars; print(jars.pinned_version('spark-kafka'))"
    # -S: no site-packages, so any third-party import fails as it would in that stage.
    result = subprocess.run(
        [sys.executable, "-S", "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == jars.pinned_version("spark-kafka")
