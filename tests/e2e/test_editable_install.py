"""What a developer who types `pip install -e .` gets: setuptools' default editable
mode cannot map http/ into arm_core.http, so importing arm_core fails at once with one
line naming `make install`, instead of a server that starts and fails at its first
request. Installed from a copy of the repository into a throwaway venv, as a newcomer
would; the suite's own install (strict mode, `make install`) imports it, as every other
test shows."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
# What a build of the package reads; the rest of the repository stays behind.
SOURCES = ("pyproject.toml", "README.md", "src", "bridge", "http", "db", "docs/contracts")


def test_a_default_editable_install_fails_at_import_naming_make_install(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    for name in SOURCES:
        source, target = ROOT / name, repo / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(repo)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr

    imported = subprocess.run(
        [python, "-c", "import arm_core"], capture_output=True, text=True, timeout=60
    )
    assert imported.returncode == 1
    last = imported.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: arm_core.http cannot be imported"), imported.stderr
    assert "run `make install`" in last, last
