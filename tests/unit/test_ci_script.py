""".ci/run installs exactly the optional test dependencies the README lists."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def readme_packages() -> set[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("Optional test dependencies", 1)[1].split("\n\n", 2)[1]
    bullets = [line for line in section.splitlines() if line.startswith("- ")]
    return {
        pkg for line in bullets for pkg in re.findall(r"`([a-z0-9.+-]+)`", line.split(" — ")[0])
    }


def ci_packages() -> set[str]:
    script = (REPO / ".ci" / "run").read_text()
    match = re.search(r"^PACKAGES=\(([^)]*)\)", script, re.MULTILINE)
    assert match is not None, "PACKAGES=(…) not found in .ci/run"
    return set(match.group(1).split())


def test_ci_installs_what_the_readme_lists() -> None:
    assert readme_packages() >= {"graphviz", "chromium", "podman"}
    assert ci_packages() == readme_packages()
