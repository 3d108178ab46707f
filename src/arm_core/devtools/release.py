"""`make release VERSION=X.Y.Z`: cut a release from a clean checkout whose version is
`X.Y.Z.devN` and whose CHANGELOG.md opens with "## Unreleased (X.Y.Z)".

    python -m arm_core.devtools.release X.Y.Z            # the release, in two commits
    python -m arm_core.devtools.release fixture COMMIT    # the previous-release fixture only

It makes two commits and a tag:

1. "Version X.Y.Z": pyproject.toml's version, the Containerfile's label and
   http/openapi.json's info.version become X.Y.Z,
   and the CHANGELOG's "## Unreleased (X.Y.Z)" becomes "## X.Y.Z — <today>". That commit
   is the release: the tag `vX.Y.Z` goes on it.
2. "Open X.Y+1.0.dev0": the version becomes the next MINOR as a pre-release, the
   CHANGELOG's entry names the release's commit ("## X.Y.Z — <day>, commit <hash>") under
   a new "## Unreleased (X.Y+1.0)", and tests/fixtures/previous_release becomes X.Y.Z:
   the wheel pip builds from the release's commit (its `git archive`), which the upgrade
   tests install, and a README naming the commit.

Push both commits and the tag yourself (`git push --follow-tags`). What each version's
number may change: the CHANGELOG's policy. tests/unit/test_version.py holds the markers
equal between releases."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from arm_core.devtools.generated import CHECKOUT

FIXTURE = Path("tests/fixtures/previous_release")
_RELEASE = r"(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)\.(?:0|[1-9][0-9]*)"
RELEASE = re.compile(_RELEASE)
DEV = re.compile(rf"({_RELEASE})\.dev(?:0|[1-9][0-9]*)")
# "## Unreleased (1.1.0)", "## 1.0.0 — 2026-12-04" or "## 1.0.0 — 2026-12-04, commit abc…".
_HEADING = re.compile(
    rf"^## (?:Unreleased \((?P<next>{_RELEASE})\)"
    rf"|(?P<version>{_RELEASE}) — (?P<date>\d{{4}}-\d\d-\d\d)"
    r"(?:, commit (?P<commit>[0-9a-f]{7,40}))?)$",
    re.MULTILINE,
)
# The length of a commit hash where the CHANGELOG names one.
SHORT = 12


class ReleaseError(Exception):
    """A release that cannot be cut as asked: the message says why."""


@dataclass(frozen=True)
class Entry:
    """One version's heading in CHANGELOG.md: `date` is None for the unreleased one."""

    version: str
    date: str | None
    commit: str | None


def entries(changelog: str) -> list[Entry]:
    """The versions' headings, newest first."""
    return [
        Entry(m["next"], None, None) if m["next"] else Entry(m["version"], m["date"], m["commit"])
        for m in _HEADING.finditer(changelog)
    ]


def release_of(version: str) -> str:
    """The release a version is or leads to: 1.1.0.dev0 → 1.1.0, 1.0.0 → 1.0.0."""
    if RELEASE.fullmatch(version):
        return version
    if m := DEV.fullmatch(version):
        return m[1]
    raise ReleaseError(f"{version!r} is neither X.Y.Z nor X.Y.Z.devN")


def next_dev(released: str) -> str:
    """The version main carries after `released`: the next MINOR, as a pre-release."""
    major, minor, _ = (int(p) for p in released.split("."))
    return f"{major}.{minor + 1}.0.dev0"


def dated(changelog: str, version: str, day: dt.date) -> str:
    """ "## Unreleased (version)" becomes "## version — day"."""
    found = entries(changelog)
    if not found or found[0] != Entry(version, None, None):
        newest = f"{found[0]}" if found else "no version heading"
        raise ReleaseError(f"CHANGELOG.md's newest entry is not Unreleased ({version}): {newest}")
    return changelog.replace(
        f"## Unreleased ({version})\n", f"## {version} — {day.isoformat()}\n", 1
    )


def opened(changelog: str, released: str, commit: str, following: str) -> str:
    """The released entry names its commit, under a new "## Unreleased (following)"."""
    found = entries(changelog)
    if not found or found[0].version != released or found[0].date is None:
        raise ReleaseError(f"CHANGELOG.md's newest entry is not a dated {released}")
    heading = f"## {released} — {found[0].date}"
    return changelog.replace(
        f"{heading}\n",
        f"## Unreleased ({following})\n\n{heading}, commit {commit[:SHORT]}\n",
        1,
    )


def with_version(pyproject: str, version: str) -> str:
    return _replace_one(pyproject, r'^version = "[^"]+"$', f'version = "{version}"', "pyproject")


def with_label(containerfile: str, version: str) -> str:
    return _replace_one(
        containerfile,
        r'org\.opencontainers\.image\.version="[^"]+"',
        f'org.opencontainers.image.version="{version}"',
        "Containerfile",
    )


def with_api_version(openapi: str, version: str) -> str:
    """http/openapi.json's info.version: the document changes with the release."""
    return _replace_one(
        openapi,
        r'^(  "info": \{\n    "title": "[^"\n]*",\n    "version": ")[^"]+"',
        rf'\g<1>{version}"',
        "openapi.json",
    )


def _replace_one(text: str, pattern: str, new: str, name: str) -> str:
    changed, n = re.subn(pattern, new, text, flags=re.MULTILINE)
    if n != 1:
        raise ReleaseError(f"{name}: {n} matches of {pattern!r}, not one")
    return changed


def fixture_readme(version: str, commit: str, wheel: str) -> str:
    """tests/fixtures/previous_release/README.md, as the fixture step writes it."""
    return f"""# The previous release, for the upgrade tests

Version {version}: `{wheel}`, the wheel pip builds from commit
`{commit}` (its `git archive`) — what a deployment of {version} installed.
Its `arm_core/sql/migrations/`, `arm_core/sql/functions/` and `arm_core/queries.sql` are that
release's db/migrations, db/functions and src/arm_core/queries.sql.

tests/integration/test_upgrade.py installs {version}'s schema and upgrades it with its data;
tests/e2e/test_rolling_deploy.py runs {version}'s `arm-core bridge` and `serve` from this
wheel (unpacked onto PYTHONPATH, on this tree's dependencies) while today's replace them
(tests/support/previous_release.py).

Written by `python -m arm_core.devtools.release fixture <commit>`, which `make release`
runs for each release; never edited by hand.
"""


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def wheel_version(wheel: Path) -> str:
    """The Version of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as whl:
        [metadata] = [n for n in whl.namelist() if n.endswith(".dist-info/METADATA")]
        text = whl.read(metadata).decode()
    m = re.search(r"^Version: (\S+)$", text, re.MULTILINE)
    if m is None:
        raise ReleaseError(f"{wheel.name}: no Version in its METADATA")
    return m[1]


def build_fixture(root: Path, commit: str) -> Path:
    """tests/fixtures/previous_release from `commit`: pip's wheel of its `git archive`
    (file times the commit's, so the same commit gives the same files) and the README.
    The commit must be a release: a version X.Y.Z, no .dev."""
    commit = git(root, "rev-parse", "--verify", f"{commit}^{{commit}}")
    epoch = git(root, "log", "-1", "--format=%ct", commit)
    target = root / FIXTURE
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "source.zip"
        git(root, "archive", "--format=zip", f"--output={archive}", "--prefix=source/", commit)
        with zipfile.ZipFile(archive) as source:
            source.extractall(tmp)
        built = Path(tmp) / "wheel"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--no-deps",
                "-w",
                str(built),
                str(Path(tmp) / "source"),
            ],
            check=True,
            env={**os.environ, "SOURCE_DATE_EPOCH": epoch},
        )
        [wheel] = built.glob("*.whl")
        version = wheel_version(wheel)
        if not RELEASE.fullmatch(version):
            raise ReleaseError(f"{commit} is version {version}, not a release")
        folders = [p.name for p in target.iterdir() if p.is_dir()]
        if folders:
            raise ReleaseError(f"{target}: the fixture holds files only; remove {folders}")
        for old in target.iterdir():
            old.unlink()
        wheel.rename(target / wheel.name)
    (target / "README.md").write_text(fixture_readme(version, commit, wheel.name), "utf-8")
    return target / wheel.name


def release(root: Path, version: str, day: dt.date) -> tuple[str, str]:
    """The two commits and the tag (module docstring); returns the commits' hashes."""
    if git(root, "status", "--porcelain"):
        raise ReleaseError("the checkout has changes: commit or stash them first")
    pyproject, containerfile, openapi, changelog = (
        root / "pyproject.toml",
        root / "Containerfile",
        root / "http" / "openapi.json",
        root / "CHANGELOG.md",
    )
    current = re.search(r'^version = "([^"]+)"$', pyproject.read_text("utf-8"), re.MULTILINE)
    if current is None or not DEV.fullmatch(current[1]) or release_of(current[1]) != version:
        raise ReleaseError(
            f"pyproject.toml's version is {current and current[1]!r}: releasing {version} "
            f"needs {version}.devN"
        )
    if git(root, "tag", "--list", f"v{version}"):
        raise ReleaseError(f"the tag v{version} exists")

    def rewrite(version_now: str, log: str) -> None:
        pyproject.write_text(with_version(pyproject.read_text("utf-8"), version_now), "utf-8")
        containerfile.write_text(with_label(containerfile.read_text("utf-8"), version_now))
        openapi.write_text(with_api_version(openapi.read_text("utf-8"), version_now), "utf-8")
        changelog.write_text(log, "utf-8")

    rewrite(version, dated(changelog.read_text("utf-8"), version, day))
    git(root, "commit", "--quiet", "-am", f"Version {version}", "-m", _why_release(version))
    released = git(root, "rev-parse", "HEAD")
    git(root, "tag", "-a", f"v{version}", "-m", f"arm-core {version}", released)
    following = next_dev(version)
    rewrite(
        following, opened(changelog.read_text("utf-8"), version, released, release_of(following))
    )
    build_fixture(root, released)
    git(root, "add", "--all", str(FIXTURE))
    git(root, "commit", "--quiet", "-am", f"Open {following}", "-m", _why_open(version, released))
    return released, git(root, "rev-parse", "HEAD")


def _why_release(version: str) -> str:
    return (
        f"The version, the image's label and the CHANGELOG's entry say {version}, dated;\n"
        f"the tag v{version} marks this commit."
    )


def _why_open(version: str, commit: str) -> str:
    return (
        f"main carries the next version as a pre-release; the CHANGELOG names\n"
        f"{version}'s commit ({commit[:SHORT]}), and the upgrade tests start from\n"
        f"{version}, built from that commit (tests/fixtures/previous_release)."
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arm_core.devtools.release",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("what", help="X.Y.Z to release, or `fixture`")
    parser.add_argument("commit", nargs="?", help="with `fixture`: the release's commit")
    args = parser.parse_args(argv)
    try:
        if args.what == "fixture":
            if not args.commit:
                parser.error("fixture needs the release's COMMIT")
            print(f"wrote {build_fixture(CHECKOUT, args.commit)}")
            return 0
        if not RELEASE.fullmatch(args.what):
            parser.error(f"VERSION {args.what!r} is not X.Y.Z")
        released, opened_at = release(CHECKOUT, args.what, dt.datetime.now(dt.UTC).date())
    except ReleaseError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 2
    print(
        f"v{args.what} is {released[:SHORT]}; {opened_at[:SHORT]} opens the next version.\n"
        "Check both commits, then: git push --follow-tags"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
