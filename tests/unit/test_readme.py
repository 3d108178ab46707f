"""The README is an entry page: under 200 lines, its two commands before any picture, and
the time `make test` takes quoted from the report that measured it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_is_under_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move detail to docs/"


def test_the_two_commands_come_before_any_picture() -> None:
    text = README.read_text(encoding="utf-8")
    commands = min(text.index("make run    #"), text.index("make test   #"))
    picture = re.search(r"!\[[^\]]*\]\(", text)
    assert picture is None or commands < picture.start()


def test_the_time_of_make_test_is_the_last_measured_run() -> None:
    report = (ROOT / "docs" / "test-durations.md").read_text(encoding="utf-8")
    measured = re.search(r"the suite's wall-clock time: (\d+ s \([\d.]+ min\))", report)
    assert measured, "docs/test-durations.md states no wall-clock time"
    text = README.read_text(encoding="utf-8")
    said = re.search(r"How long `make test` takes:\*\* its last measured run took (.+?) on", text)
    assert said, "the README does not say how long `make test` takes"
    assert said[1] == measured[1], f"README says {said[1]}; docs/test-durations.md {measured[1]}"
