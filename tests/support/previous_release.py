"""The previous release (tests/fixtures/previous_release): the wheel pip built from its
commit, unpacked into a folder that goes first on PYTHONPATH, where `python -m
arm_core.cli` is that release's `arm-core` on this tree's dependencies
(tests/unit/test_version.py checks that they satisfy the release's requirements)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

PREVIOUS = Path(__file__).resolve().parents[1] / "fixtures" / "previous_release"


def previous_wheel() -> Path:
    [wheel] = PREVIOUS.glob("*.whl")
    return wheel


def read(name: str) -> str:
    """A file of the release's package, e.g. `arm_core/queries.sql`."""
    with zipfile.ZipFile(previous_wheel()) as whl:
        return whl.read(name).decode()


def names(folder: str) -> list[str]:
    """The files of a folder of the release's package (`arm_core/sql/functions/`), sorted."""
    with zipfile.ZipFile(previous_wheel()) as whl:
        return sorted(n for n in whl.namelist() if n.startswith(folder) and n != folder)


def unpacked(folder: Path) -> Path:
    """The wheel unpacked into `folder` (made once), which is returned."""
    if not (folder / "arm_core").is_dir():
        with zipfile.ZipFile(previous_wheel()) as whl:
            whl.extractall(folder)
    return folder


# The previous release's `arm-core` (with :func:`environment`). -P: the working directory
# is not put first on sys.path, where a checkout's arm_core.egg-info would say its version.
PROGRAM = (sys.executable, "-P", "-m", "arm_core.cli")


def migrate(url: str, site: Path) -> None:
    """The previous release's `arm-core migrate` on `url`: its migrations, its function
    files and its grants, as it did."""
    done = subprocess.run(
        [*PROGRAM, "migrate"],
        env={**os.environ, **environment(site), "DATABASE_URL": url},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, f"the previous release's migrate: {done.stdout}{done.stderr}"


def environment(site: Path) -> dict[str, str]:
    """PYTHONPATH with the unpacked release first: its arm_core, and its metadata (so it
    says its own version), come before this tree's."""
    rest = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(site), *([rest] if rest else [])])}


def requirements() -> list[str]:
    """The release's Requires-Dist without extras' (what its processes import)."""
    metadata = read(next(n for n in _all() if n.endswith(".dist-info/METADATA")))
    return [
        m[1].strip()
        for m in re.finditer(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE)
        if "extra ==" not in m[1]
    ]


def _all() -> list[str]:
    with zipfile.ZipFile(previous_wheel()) as whl:
        return whl.namelist()
