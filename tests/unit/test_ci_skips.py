"""Under CI=true a skip fails the run, with its reason; elsewhere a skip is a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SKIPPING = """
import pytest

def test_runs():
    assert True

def test_needs_a_package():
    pytest.skip("apt-get install some-package")
"""
MODULE_SKIP = """
import pytest
pytest.skip("apt-get install chromium", allow_module_level=True)
"""


def run(tmp_path: Path, source: str, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.ci_skips", "-q",
         "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("source", [SKIPPING, MODULE_SKIP])
def test_a_skip_fails_the_run_under_ci(tmp_path: Path, source: str) -> None:
    done = run(tmp_path, source, "true")
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout
    assert "skipped test(s) fail the run" in done.stdout
    assert "apt-get install" in done.stdout  # the reason, naming what to install


def test_a_skip_is_a_skip_elsewhere(tmp_path: Path) -> None:
    done = run(tmp_path, SKIPPING, None)
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout
