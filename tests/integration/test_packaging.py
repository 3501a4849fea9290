"""The wheel installs one top-level package, ``baton``: no ``domain``, ``projections`` or ``adapters`` that
would collide with a user's own modules."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_only_the_baton_package(tmp_path: Path) -> None:
    """Given the repository, when its wheel is built, then every module in it lives under ``baton/``."""
    source = tmp_path / "source"  # a copy: building leaves build/ behind, and a stale one would be packaged
    skipped = shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis")
    shutil.copytree(ROOT, source, symlinks=True, ignore=skipped)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = tmp_path.glob("baton_ledger-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/", 1)[0] for name in names if not name.split("/", 1)[0].endswith(".dist-info")}

    assert top_level == {"baton"}
    assert {"baton/domain/decide.py", "baton/projections/audit.py", "baton/adapters/bootstrap.py"} <= set(names)
