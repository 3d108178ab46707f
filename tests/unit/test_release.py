"""`make release VERSION=X.Y.Z` (arm_core.devtools.release): the CHANGELOG's and the
version's rewrites, and a whole release cut in a git repository of its own."""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from arm_core.devtools.release import (
    FIXTURE,
    Entry,
    ReleaseError,
    dated,
    entries,
    main,
    next_dev,
    opened,
    release,
    release_of,
    wheel_version,
    with_api_version,
    with_label,
    with_version,
)

LOG = textwrap.dedent("""\
    # Changelog

    ## Versions and what they may change

    ## Unreleased (1.1.0)

    - **Added**: something.

    ## 1.0.0 — 2026-12-04, commit f44a3b62574c

    The first.
    """)
DAY = dt.date(2026, 12, 20)
OPENAPI = (
    '{{\n  "openapi": "3.1.0",\n  "info": {{\n    "title": "t",\n    "version": "{version}",\n'
    '    "description": "d"\n  }},\n  "paths": {{"/x": {{"get": {{"version": "9"}}}}}}\n}}\n'
)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_entries_newest_first() -> None:
    assert entries(LOG) == [
        Entry("1.1.0", None, None),
        Entry("1.0.0", "2026-12-04", "f44a3b62574c"),
    ]


@pytest.mark.parametrize(
    ("version", "release"), [("1.1.0.dev0", "1.1.0"), ("1.0.0", "1.0.0"), ("2.0.0.dev3", "2.0.0")]
)
def test_release_of(version: str, release: str) -> None:
    assert release_of(version) == release


@pytest.mark.parametrize("version", ["1.1", "1.1.0-dev", "1.1.0rc1", "01.1.0"])
def test_release_of_refuses_what_is_no_version_of_ours(version: str) -> None:
    with pytest.raises(ReleaseError, match=re.escape("neither X.Y.Z nor X.Y.Z.devN")):
        release_of(version)


def test_the_next_version_is_the_next_minor_as_a_pre_release() -> None:
    assert next_dev("1.1.0") == "1.2.0.dev0"
    assert next_dev("2.0.3") == "2.1.0.dev0"


def test_a_release_dates_the_unreleased_entry_then_names_its_commit() -> None:
    released = dated(LOG, "1.1.0", DAY)
    assert entries(released)[0] == Entry("1.1.0", "2026-12-20", None)
    assert "- **Added**: something." in released
    reopened = opened(released, "1.1.0", COMMIT, "1.2.0")
    assert entries(reopened)[:2] == [
        Entry("1.2.0", None, None),
        Entry("1.1.0", "2026-12-20", COMMIT[:12]),
    ]
    # Only the heading lines change.
    assert (
        reopened.replace("## Unreleased (1.2.0)\n\n", "").replace(
            f"## 1.1.0 — 2026-12-20, commit {COMMIT[:12]}", "## Unreleased (1.1.0)"
        )
        == LOG
    )


def test_a_release_of_another_version_than_the_unreleased_entry_s_is_refused() -> None:
    with pytest.raises(ReleaseError, match=r"not Unreleased \(1\.2\.0\)"):
        dated(LOG, "1.2.0", DAY)
    with pytest.raises(ReleaseError, match=re.escape("not a dated 1.1.0")):
        opened(LOG, "1.1.0", COMMIT, "1.2.0")


def test_version_and_label_rewrites_change_one_line_each() -> None:
    assert with_version('[project]\nname = "x"\nversion = "1.1.0.dev0"\n', "1.1.0") == (
        '[project]\nname = "x"\nversion = "1.1.0"\n'
    )
    label = 'LABEL a="b" \\\n      org.opencontainers.image.version="1.1.0.dev0"\n'
    assert with_label(label, "1.1.0") == label.replace("1.1.0.dev0", "1.1.0")
    with pytest.raises(ReleaseError, match="0 matches"):
        with_label("FROM x\n", "1.1.0")
    api = OPENAPI.format(version="1.1.0.dev0")
    assert with_api_version(api, "1.1.0") == api.replace("1.1.0.dev0", "1.1.0")


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout.strip()


def project(root: Path) -> Path:
    """A repository shaped like this one, at 2.3.0.dev0, one release (2.2.0) behind."""
    root.mkdir()
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""\
            [build-system]
            requires = ["setuptools>=68"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "release-test-project"
            version = "2.3.0.dev0"

            [tool.setuptools]
            packages = ["release_test_project"]
            """)
    )
    (root / "release_test_project").mkdir()
    (root / "release_test_project" / "__init__.py").write_text("")
    (root / "Containerfile").write_text('LABEL org.opencontainers.image.version="2.3.0.dev0"\n')
    (root / "http").mkdir()
    (root / "http" / "openapi.json").write_text(OPENAPI.format(version="2.3.0.dev0"))
    (root / "CHANGELOG.md").write_text(
        "# Changelog\n\n## Unreleased (2.3.0)\n\n- a change\n\n"
        "## 2.2.0 — 2026-11-01, commit 0123456789ab\n"
    )
    (root / FIXTURE).mkdir(parents=True)
    (root / FIXTURE / "README.md").write_text("2.2.0\n")
    git(root, "init", "--quiet")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "2.3.0")
    git(root, "config", "user.name", "t")
    git(root, "config", "user.email", "t@example.invalid")
    return root


@pytest.mark.timeout(120)
def test_a_release_makes_the_release_commit_its_tag_and_the_commit_that_opens_the_next(
    tmp_path: Path,
) -> None:
    root = project(tmp_path / "repo")
    released, opened_at = release(root, "2.3.0", DAY)

    # The release's commit: 2.3.0, dated; the tag on it.
    assert git(root, "rev-parse", "v2.3.0^{commit}") == released
    assert 'version = "2.3.0"' in git(root, "show", f"{released}:pyproject.toml")
    assert 'version="2.3.0"' in git(root, "show", f"{released}:Containerfile")
    assert (
        git(root, "show", f"{released}:http/openapi.json")
        == OPENAPI.format(version="2.3.0").strip()
    )
    assert entries(git(root, "show", f"{released}:CHANGELOG.md"))[0] == Entry(
        "2.3.0", "2026-12-20", None
    )
    # The next: 2.4.0.dev0, the entry names the release's commit, the fixture is 2.3.0.
    assert git(root, "rev-parse", "HEAD") == opened_at
    assert git(root, "rev-parse", "HEAD~1") == released
    assert git(root, "status", "--porcelain") == ""
    assert 'version = "2.4.0.dev0"' in (root / "pyproject.toml").read_text()
    assert 'version="2.4.0.dev0"' in (root / "Containerfile").read_text()
    assert (root / "http" / "openapi.json").read_text() == OPENAPI.format(version="2.4.0.dev0")
    assert entries((root / "CHANGELOG.md").read_text())[:2] == [
        Entry("2.4.0", None, None),
        Entry("2.3.0", "2026-12-20", released[:12]),
    ]
    [wheel] = (root / FIXTURE).glob("*.whl")
    assert wheel_version(wheel) == "2.3.0"
    assert f"`{released}`" in (root / FIXTURE / "README.md").read_text()
    assert sorted(p.name for p in (root / FIXTURE).iterdir()) == ["README.md", wheel.name]

    # Again: the version is no longer 2.3.0.devN, and the tag exists.
    with pytest.raises(ReleaseError, match=re.escape("needs 2.3.0.devN")):
        release(root, "2.3.0", DAY)


def test_a_release_from_a_checkout_with_changes_is_refused(tmp_path: Path) -> None:
    root = project(tmp_path / "repo")
    (root / "CHANGELOG.md").write_text("edited\n")
    with pytest.raises(ReleaseError, match="the checkout has changes"):
        release(root, "2.3.0", DAY)
    assert git(root, "tag", "--list") == ""


def test_the_command_line_refuses_a_version_that_is_not_x_y_z(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["1.1"])
    assert done.value.code == 2
    assert "VERSION '1.1' is not X.Y.Z" in capsys.readouterr().err
