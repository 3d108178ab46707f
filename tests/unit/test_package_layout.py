"""The one package arm_core, assembled without symlinks (pyproject.toml
[tool.setuptools.package-dir]): src/arm_core, bridge/ as arm_core.bridge, http/ as
arm_core.http, db/ as arm_core.sql, docs/contracts/ as arm_core.contracts. bridge/ and
http/ are loaded once, as arm_core.bridge and arm_core.http."""

import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_git_tracks_no_symlink() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    links = [line for line in listed.stdout.splitlines() if line.startswith("120000 ")]
    assert links == []


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> Iterator[set[str]]:
    """The file names of a wheel built from the checkout, as the Containerfile builds it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--wheel-dir", str(out), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    [wheel] = out.glob("arm_core-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        yield set(zf.namelist())


def _in(folder: Path, pattern: str) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.glob(pattern)}


@pytest.mark.parametrize(
    ("folder", "package", "patterns"),
    [
        ("src/arm_core", "arm_core", ["*.py", "*.sql", "py.typed", "console/*"]),
        ("src/arm_core/devtools", "arm_core/devtools", ["*.py"]),
        ("src/arm_core/devtools/testbed", "arm_core/devtools/testbed", ["*.py"]),
        ("bridge", "arm_core/bridge", ["*.py"]),
        ("http", "arm_core/http", ["*.py", "openapi.json"]),
        ("db", "arm_core/sql", ["roles.sql", "grants.sql", "functions/*.sql", "migrations/*.sql"]),
        ("docs/contracts", "arm_core/contracts", ["*.json", "*.md", "examples/*.json"]),
    ],
)
def test_the_wheel_holds_each_folder_under_its_package_name(
    wheel_names: set[str], folder: str, package: str, patterns: list[str]
) -> None:
    expected = set().union(*(_in(ROOT / folder, pattern) for pattern in patterns))
    assert len(expected) >= len(patterns), expected  # each pattern matched something
    assert {f"{package}/{name}" for name in expected} <= wheel_names


def test_the_wheel_has_no_other_top_level_package(wheel_names: set[str]) -> None:
    tops = {PurePosixPath(name).parts[0] for name in wheel_names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"arm_core"}, tops
    # http/README.md documents the folder; db/schema.sql and db/README.md are for
    # reviewers and DBAs: none of them is package data.
    assert not {"arm_core/http/README.md", "arm_core/sql/schema.sql"} & wheel_names


def test_the_wheel_carries_the_licence_and_notice(wheel_names: set[str]) -> None:
    licences = {
        PurePosixPath(name).name
        for name in wheel_names
        if PurePosixPath(name).parent.name == "licenses"
        and PurePosixPath(name).parent.parent.name.endswith(".dist-info")
    }
    assert licences == {"LICENSE", "NOTICE"}


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
