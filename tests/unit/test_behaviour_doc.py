"""docs/behaviour.md defines every requirement and scenario ID the repository cites.

Code comments, SQL, tests and the README cite requirement IDs (`R-OUT-1`) and scenario
IDs (`S-RT-4`); docs/behaviour.md defines each one once, as a bold anchor starting a
list item whose anchor is the ID in lower case:
`- <a id="r-out-1"></a>**R-OUT-1** — what must hold`.

What fails:

* an ID cited anywhere in the repository that the page does not define;
* a requirement (`R-…`) the page defines that nothing cites: a rule no code, SQL or test
  claims is either dead or was never built, and the page must not invent one. Scenarios
  (`S-…`) may stand uncited: the page is the catalogue of acceptance scenarios, and one
  that no test names yet is a visible gap (its entry then names no test), not an error;
* an ID defined twice, with the wrong anchor, or mentioned on the page without being
  defined there;
* a scenario entry naming a test file (`tests/….py`) that does not exist or does not cite
  the scenario, and a scenario that tests cite whose entry names none of them;
* one of the page's section anchors missing from it, or a
  `behaviour.md#anchor` link anywhere in the repository that leads nowhere.

"Cited" means found by `\\b[RS]-[A-Z]+-[0-9]+\\b` in any text file of the working tree
(UTF-8, no NUL byte: code, SQL, tests, the README, docs, build and configuration files —
wider than the `*.py *.sql *.md *.js` of the first grep, so a citation in a Containerfile
or compose.yaml counts too), except: generated or foreign trees (.git, .venv, .dev,
build, dist, caches, *.egg-info, wheelhouse), tests/fixtures (the previous release,
kept verbatim for the upgrade test), docs/behaviour.md itself and this file.
"""

from __future__ import annotations

import functools
import os
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "behaviour.md"
THIS = Path(__file__).resolve()

ID = re.compile(r"\b[RS]-[A-Z]+-[0-9]+\b")
DEFINITION = re.compile(r'^- <a id="(?P<anchor>[^"]*)"></a>\*\*(?P<id>[RS]-[A-Z]+-[0-9]+)\*\*')
ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
TEST_PATH = re.compile(r"`(tests/[\w./-]+\.py)`")
DOC_LINK = re.compile(r"behaviour\.md#([\w-]+)")
LOCAL_LINK = re.compile(r"\]\(#([\w-]+)\)")

# The page's sections: other pages and the code link to each (behaviour.md#<anchor>).
SECTIONS = [
    "overview",
    "sources",
    "data-model",
    "state-machine",
    "outbox",
    "ack",
    "inbox",
    "timeouts",
    "retry",
    "nats",
    "contracts",
    "configuration",
    "interfaces",
]

PRUNED_DIRS = {
    ".git",
    ".venv",
    ".dev",
    "build",
    "dist",
    "wheelhouse",
    "node_modules",
    "__pycache__",
    ".hypothesis",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
}
PRUNED_PATHS = {ROOT / "tests" / "fixtures"}
SKIPPED_FILES = {DOC, THIS}


def _text_files() -> list[Path]:
    found: list[Path] = []
    for top, dirs, files in os.walk(ROOT):  # symlinked directories are not followed
        here = Path(top)
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in PRUNED_DIRS and not d.endswith(".egg-info") and here / d not in PRUNED_PATHS
        )
        for name in sorted(files):
            path = here / name
            if path in SKIPPED_FILES or not path.is_file():
                continue
            data = path.read_bytes()
            if b"\0" in data:
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            found.append(path)
    return found


@functools.cache
def _texts() -> dict[str, str]:
    """Every scanned file's text, by its path relative to the repository."""
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in _text_files()}


@functools.cache
def cited() -> dict[str, frozenset[str]]:
    """Every ID cited in the repository, with the files that cite it."""
    where: defaultdict[str, set[str]] = defaultdict(set)
    for rel, text in _texts().items():
        for found in ID.findall(text):
            where[found].add(rel)
    return {k: frozenset(v) for k, v in where.items()}


@functools.cache
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


@functools.cache
def entries() -> dict[str, tuple[str, str]]:
    """Each ID the page defines → (its anchor, its entry's text: the list item, i.e. the
    definition line and its indented continuation lines). Defined twice: the first."""
    found: dict[str, tuple[str, str]] = {}
    lines = doc().splitlines()
    for i, line in enumerate(lines):
        m = DEFINITION.match(line)
        if m is None:
            continue
        body = [line]
        for more in lines[i + 1 :]:
            if not more.startswith("  ") or not more.strip():
                break
            body.append(more)
        found.setdefault(m["id"], (m["anchor"], "\n".join(body)))
    return found


def test_the_scan_sees_the_citations() -> None:
    """A guard for the checks below: a scan that found nothing would pass them all."""
    where = cited()
    assert where, "no R-/S- ID found in the repository: is the scan broken?"
    files = {f for fs in where.values() for f in fs}
    for part in ("db/", "bridge/", "tests/", "README.md"):
        assert any(f.startswith(part) for f in files), f"no citation found under {part}"
    assert not any(f.startswith("tests/fixtures/") for f in files)


def test_every_cited_id_is_defined() -> None:
    where = cited()
    missing = sorted(set(where) - set(entries()))
    assert not missing, "cited but not defined in docs/behaviour.md:\n" + "\n".join(
        f"  {i}: {', '.join(sorted(where[i]))}" for i in missing
    )


def test_every_defined_requirement_is_cited() -> None:
    uncited = sorted(i for i in entries() if i.startswith("R-") and i not in cited())
    assert not uncited, (
        f"docs/behaviour.md defines requirements nothing in the repository cites: {uncited} "
        "(cite them where they are held, or remove them from the page)"
    )


def test_ids_are_defined_once_with_their_anchor() -> None:
    text = doc()
    defined = [DEFINITION.match(line) for line in text.splitlines()]
    ids = [m["id"] for m in defined if m is not None]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    assert not twice, f"defined more than once: {twice}"
    wrong = sorted(f"{i} → #{a}" for i, (a, _) in entries().items() if a != i.lower())
    assert not wrong, f"an ID's anchor is the ID in lower case: {wrong}"
    undefined = sorted(set(ID.findall(text)) - set(entries()))
    assert not undefined, f"docs/behaviour.md mentions IDs it does not define: {undefined}"


def test_scenarios_name_the_tests_that_prove_them() -> None:
    where = cited()
    problems: list[str] = []
    for sid, (_, body) in sorted(entries().items()):
        if not sid.startswith("S-"):
            continue
        named = TEST_PATH.findall(body)
        citing = sorted(f for f in where.get(sid, ()) if f.startswith("tests/"))
        for path in named:
            if not (ROOT / path).is_file():
                problems.append(f"{sid} names {path}, which does not exist")
            elif path not in citing:
                problems.append(f"{sid} names {path}, which does not cite {sid}")
        if citing and not named:
            problems.append(f"{sid} names no test; these cite it: {', '.join(citing)}")
    assert not problems, "\n".join(problems)


def test_section_anchors_exist_and_every_link_resolves() -> None:
    anchors = set(ANCHOR.findall(doc()))
    missing = sorted(f"#{a}" for a in SECTIONS if a not in anchors)
    assert not missing, f"section anchors missing from docs/behaviour.md: {missing}"
    dangling = sorted(
        f"{rel}: behaviour.md#{a}"
        for rel, text in _texts().items()
        for a in DOC_LINK.findall(text)
        if a not in anchors
    )
    dangling += sorted(
        f"docs/behaviour.md: (#{a})" for a in LOCAL_LINK.findall(doc()) if a not in anchors
    )
    assert not dangling, "links to anchors docs/behaviour.md does not have:\n" + "\n".join(dangling)
