"""docs/architecture.md stays true: its picture is the render of its checked-in source,
every path it names exists, and its layers are the import contract's."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def test_architecture_svg_is_the_render_of_its_source() -> None:
    dot = shutil.which("dot")
    if dot is None:
        pytest.skip("graphviz is not installed (apt-get install graphviz) to render the SVG")
    rendered = subprocess.run(
        [dot, "-Tsvg", str(DOCS / "architecture.dot")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert rendered == (DOCS / "architecture.svg").read_text(encoding="utf-8"), (
        "docs/architecture.svg is not the render of docs/architecture.dot: run `make docs`"
    )


def test_every_path_the_architecture_page_names_exists() -> None:
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    # arm_core/ too: a path of the layout before src/ must not go unnoticed.
    tops = "db|src|arm_core|bridge|http|tests|benchmarks|docs"
    named = set(re.findall(rf"`((?:{tops})/[\w./-]*)`", text))
    assert named, "the page names no paths"
    missing = sorted(p for p in named if not (ROOT / p.rstrip("/")).exists())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_architecture_page_lists_the_layers_the_contract_enforces() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    [layers] = [
        contract["layers"]
        for contract in pyproject["tool"]["importlinter"]["contracts"]
        if contract["type"] == "layers"
    ]
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    block = text[text.index("```text\n", text.index("\n## Modules\n")) :]
    listed = block.split("\n```")[0].splitlines()[1:]
    assert listed == layers, "docs/architecture.md's layers are not pyproject.toml's contract"
