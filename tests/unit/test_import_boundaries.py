"""The import boundaries of pyproject.toml [tool.importlinter] hold: the runtime
never imports arm_core.devtools, and arm_core never imports tests or benchmarks. `make
lint` runs lint-imports too; this test makes a bare `pytest` check them as well."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def test_import_contracts_are_kept() -> None:
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout
