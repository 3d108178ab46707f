"""One version, said the same everywhere: pyproject.toml's is what `arm-core --version`
prints and the image's label. Between releases it is the next release as a pre-release
(X.Y.Z.devN), and CHANGELOG.md opens with "Unreleased (X.Y.Z)"; a release is X.Y.Z and
its entry is dated. Every earlier release's entry names its commit, and the
previous-release fixture is the newest of them, built from that commit."""

from __future__ import annotations

import importlib.metadata
import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from arm_core import cli
from arm_core.devtools.release import (
    DEV,
    RELEASE,
    SHORT,
    Entry,
    entries,
    fixture_readme,
    release_of,
    wheel_version,
)
from tests.support.previous_release import PREVIOUS, previous_wheel, requirements

ROOT = Path(__file__).resolve().parents[2]


def project_version() -> str:
    loaded = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    version: str = loaded["project"]["version"]
    return version


def changelog() -> list[Entry]:
    return entries((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))


def test_the_version_is_a_release_or_the_next_one_s_pre_release() -> None:
    version = project_version()
    assert RELEASE.fullmatch(version) or DEV.fullmatch(version), version


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


def test_the_http_api_document_says_it() -> None:
    """GET /api/v1/openapi.json's info.version: the document changes with the release."""
    document = json.loads((ROOT / "http" / "openapi.json").read_text(encoding="utf-8"))
    assert document["info"]["version"] == project_version()


def test_the_changelog_s_newest_entry_is_it() -> None:
    """A pre-release's newest entry is "Unreleased (its release)", a release's is dated."""
    version = project_version()
    newest = changelog()[0]
    assert newest.version == release_of(version), newest
    assert (newest.date is None) == bool(DEV.fullmatch(version)), newest


def test_every_earlier_release_is_dated_and_names_its_commit() -> None:
    found = changelog()
    released = [e for e in found if e.date is not None]
    assert released, found
    earlier = [e for e in released if e.version != project_version()]
    assert all(e.commit is not None and len(e.commit) == SHORT for e in earlier), earlier
    assert len({e.version for e in found}) == len(found), "a version has two entries"


def test_the_previous_release_fixture_is_the_newest_earlier_release() -> None:
    """Its wheel is that version, its README names the commit the CHANGELOG names, as
    `python -m arm_core.devtools.release fixture` wrote it."""
    earlier = [e for e in changelog() if e.date is not None and e.version != project_version()]
    previous = earlier[0]
    assert previous.commit is not None
    wheel = previous_wheel()
    assert wheel_version(wheel) == previous.version
    readme = (PREVIOUS / "README.md").read_text(encoding="utf-8")
    [commit] = re.findall(r"commit\s+`([0-9a-f]{40})`", readme)
    assert commit.startswith(previous.commit)
    assert readme == fixture_readme(previous.version, commit, wheel.name)
    assert sorted(p.name for p in PREVIOUS.iterdir()) == sorted(["README.md", wheel.name])


def test_this_tree_s_dependencies_satisfy_the_previous_release_s() -> None:
    """The upgrade tests run the previous release's processes on this environment."""
    for line in requirements():
        requirement = Requirement(line)
        installed = importlib.metadata.version(requirement.name)
        assert requirement.specifier.contains(installed, prereleases=True), (line, installed)


def test_runbook_base_examples_name_the_tag_of_this_tree_s_release() -> None:
    """The Prometheus rules and their runbooks are this tree's: an example `runbook_base`
    names the tag of the release it leads to (the runbooks of an older tag lack the
    alerts added since)."""
    tag = f"v{release_of(project_version())}"
    pages = [*ROOT.glob("deploy/prometheus/*.yml"), ROOT / "docs" / "logs-and-metrics.md"]
    named = {
        (p.relative_to(ROOT).as_posix(), m)
        for p in pages
        for m in re.findall(r"/blob/(v[^/\s]+)/", p.read_text(encoding="utf-8"))
    }
    assert named and {m for _, m in named} == {tag}, named
