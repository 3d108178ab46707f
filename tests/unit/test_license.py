"""One licence everywhere: pyproject.toml's metadata, the LICENSE file, NOTICE and the
README's License section name the same one, and the installed package says it too."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SPDX = "Apache-2.0"


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def project() -> dict[str, Any]:
    return dict(pyproject()["project"])


def test_pyproject_names_the_licence_and_its_files() -> None:
    assert project()["license"] == SPDX
    assert project()["license-files"] == ["LICENSE", "NOTICE"]
    # A License :: classifier beside an SPDX expression is refused by setuptools ≥ 77.
    classifiers = project().get("classifiers", [])
    assert isinstance(classifiers, list)
    assert not [c for c in classifiers if c.startswith("License ::")]


def test_the_build_backend_reads_an_spdx_licence() -> None:
    requires = pyproject()["build-system"]["requires"]
    [setuptools] = [r for r in requires if r.startswith("setuptools")]
    found = re.fullmatch(r"setuptools>=(\d+)(?:\.\d+)*", setuptools)
    assert found and int(found[1]) >= 77, f"PEP 639 metadata needs setuptools ≥ 77: {setuptools}"


def test_the_licence_file_is_the_apache_licence_2_0_in_full() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    head = [line.strip() for line in text.strip().splitlines()[:2]]
    assert head == ["Apache License", "Version 2.0, January 2004"]
    assert "END OF TERMS AND CONDITIONS" in text
    # All nine sections of the terms.
    for n, title in enumerate(
        ["Definitions", "Grant of Copyright License", "Grant of Patent License",
         "Redistribution", "Submission of Contributions", "Trademarks",
         "Disclaimer of Warranty", "Limitation of Liability",
         "Accepting Warranty or Additional Liability"], start=1,
    ):  # fmt: skip
        assert f"{n}. {title}." in text, title


def test_notice_names_the_project_and_the_licence() -> None:
    notice = (ROOT / "NOTICE").read_text(encoding="utf-8")
    assert notice.startswith("arm-core\nCopyright ")
    assert "Apache License, Version 2.0" in notice and "LICENSE" in notice


def test_the_readme_names_the_same_licence() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## License\n", 1)
    assert len(section) == 2, "the README has no License section"
    body = section[1].split("\n## ", 1)[0]
    assert SPDX in body
    assert "(LICENSE)" in body and "(NOTICE)" in body


def test_the_installed_package_carries_the_licence() -> None:
    meta = metadata.metadata("arm-core")
    assert meta["License-Expression"] == SPDX, "reinstall: make install"
    assert set(meta.get_all("License-File") or []) == {"LICENSE", "NOTICE"}
