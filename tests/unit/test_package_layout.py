"""bridge/ and http/ are loaded once, as arm_core.bridge and arm_core.http (issue 9)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["bridge", "bridge.publisher"])
def test_bridge_cannot_be_imported_as_a_second_copy(name: str) -> None:
    # From the repository root `bridge` is an importable folder: it refuses.
    done = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "part of arm_core" in done.stderr


def test_http_from_the_root_is_the_standard_library() -> None:
    # http/ has no __init__.py on purpose: the standard library's regular package wins
    # over a namespace folder, so `http` is never this project's API.
    done = subprocess.run(
        [sys.executable, "-c", "import http.client, http; print(http.__file__)"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert str(ROOT / "http") not in done.stdout


def test_the_package_paths_load_each_module_once() -> None:
    code = (
        "import sys, arm_core.bridge.runner, arm_core.http.app; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('bridge', 'http') "
        "and m != 'http' and not m.startswith('http.') ))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
