"""One version, said the same everywhere: pyproject.toml's is what `arm-core --version`
prints, the image's label, and the newest entry of CHANGELOG.md; the previous-release
fixture says which version it is."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from arm_core import cli

ROOT = Path(__file__).resolve().parents[2]


def project_version() -> str:
    loaded = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    version: str = loaded["project"]["version"]
    return version


def test_the_version_is_semantic() -> None:
    assert re.fullmatch(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)", project_version())


def test_arm_core_version_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"arm-core {project_version()}", (
        "the installed metadata is older than pyproject.toml: run `make install`"
    )


def test_the_image_label_says_it() -> None:
    containerfile = (ROOT / "Containerfile").read_text(encoding="utf-8")
    [label] = re.findall(r'org\.opencontainers\.image\.version="([^"]+)"', containerfile)
    assert label == project_version()


def test_the_changelog_s_newest_version_is_it() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    versions = re.findall(r"^## (\d+\.\d+\.\d+)\b", changelog, re.M)
    assert versions and versions[0] == project_version(), versions


def test_the_previous_release_says_which_version_it_is() -> None:
    readme = (ROOT / "tests" / "fixtures" / "previous_release" / "README.md").read_text(
        encoding="utf-8"
    )
    assert re.search(r"\bversion 0\.\d+\.\d+\b", readme), "the fixture names no version"
