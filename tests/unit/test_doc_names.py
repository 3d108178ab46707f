"""The pages name only what the code has.

- Every `arm.<name>` in a page is in db/schema.sql (the schema a migrated database has,
  held current by its own test): a table, view, type, function, index or a setting a
  function reads — or one of db/README.md's placeholders for "a function".
- No name a migration dropped (and nothing defined again) is left in a page, with or
  without its schema: a DBA who copies it gets "function does not exist".
- Every UPPER_CASE name with an underscore in backticks — an environment variable, a
  compose or make variable, an error code, a constant — is written somewhere in the code
  (everything but the pages): a renamed or removed one does not stay documented.

The pages: the README, SECURITY.md, CONTRIBUTING.md, docs/ (Markdown and the picture's
source), db/README.md, http/README.md and the READMEs of deploy/.
tests/fixtures/previous_release/ describes an older schema on purpose."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# db/README.md's "a function x, its next version x_v2" examples.
PLACEHOLDERS = {"x", "x_v2", "x_v3"}
# Where the code is: the names the pages may use are written there.
CODE = ["src", "bridge", "http", "db", "deploy", "benchmarks", "tests", ".ci"]
CODE_FILES = ["compose.yaml", "Makefile", "Containerfile", "pyproject.toml"]
CODE_SUFFIXES = {".py", ".sql", ".json", ".yml", ".yaml", ".sh", ".toml", ""}

ARM_NAME = re.compile(r"\barm\.([a-z_][a-z0-9_]*)")
UPPER = re.compile(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?:=[^`]*)?`")
UPPER_WORD = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
DROPPED = re.compile(r"DROP\s+FUNCTION\s+(?:IF\s+EXISTS\s+)?arm\.([a-z_][a-z0-9_]*)", re.I)


def pages() -> list[Path]:
    docs = ROOT / "docs"
    return [
        ROOT / "README.md",
        ROOT / "SECURITY.md",
        ROOT / "CONTRIBUTING.md",
        *sorted(docs.rglob("*.md")),
        *sorted(docs.glob("*.dot")),
        ROOT / "db" / "README.md",
        ROOT / "http" / "README.md",
        *sorted((ROOT / "deploy").glob("*/README.md")),
    ]


def page_lines() -> Iterator[tuple[str, int, str]]:
    for page in pages():
        name = str(page.relative_to(ROOT))
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            yield name, n, line


def schema_names() -> set[str]:
    return set(ARM_NAME.findall((ROOT / "db" / "schema.sql").read_text(encoding="utf-8")))


def code_files(suffixes: set[str] = CODE_SUFFIXES) -> list[Path]:
    files = [ROOT / f for f in CODE_FILES]
    for top in CODE:
        files += [
            p
            for p in (ROOT / top).rglob("*")
            if p.is_file() and p.suffix in suffixes and "__pycache__" not in p.parts
        ]
    return files


def code_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in code_files())


def unknown_in_pages(pattern: re.Pattern[str], known: set[str], prefix: str = "") -> list[str]:
    """Each `pattern` match of a page line that is not in `known`, as page:line: name."""
    return [
        f"{page}:{n}: {prefix}{name}"
        for page, n, line in page_lines()
        for name in pattern.findall(line)
        if name not in known
    ]


def test_every_arm_name_in_the_pages_is_in_the_schema() -> None:
    unknown = unknown_in_pages(ARM_NAME, schema_names() | PLACEHOLDERS, "arm.")
    assert not unknown, "pages name what db/schema.sql does not have:\n" + "\n".join(unknown)


def test_no_page_names_a_function_a_migration_dropped() -> None:
    migrations = sorted((ROOT / "db" / "migrations").glob("*.sql"))
    dropped = {
        name
        for m in migrations
        if not m.name.endswith(".rollback.sql")
        for name in DROPPED.findall(m.read_text(encoding="utf-8"))
    } - schema_names()
    assert dropped, "no migration drops a function: the check below checks nothing"
    # Bare names: a dotted one is another namespace's (store.apply_envelopes, a Python
    # method) or arm.'s, which the test above checks.
    words = re.compile(rf"(?<![\w.])({'|'.join(sorted(dropped))})\b")
    stale = [
        f"{page}:{n}: {m.group(1)}" for page, n, line in page_lines() for m in words.finditer(line)
    ]
    assert not stale, "pages name functions migrations dropped:\n" + "\n".join(stale)


def test_every_upper_case_name_in_backticks_is_in_the_code() -> None:
    unknown = unknown_in_pages(UPPER, set(UPPER_WORD.findall(code_text())))
    assert not unknown, "pages name what no code has:\n" + "\n".join(unknown)


# Documents the repository does not hold, by the names they had where it was made.
OUTSIDE = re.compile(
    r"\bseed \d{3}\b|\bseeds? \d{3}(?:/\d{3})+|(?-i:\bSPEC\b)|\bOQ-\d+|\bissues? \d+\b|"
    r"\bdesign card\b|\bthis slice\b",
    re.IGNORECASE,
)
# The previous release is kept verbatim for the upgrade test.
VERBATIM = ROOT / "tests" / "fixtures" / "previous_release"


def test_nothing_names_a_document_the_repository_does_not_hold() -> None:
    files = pages() + [
        p
        for p in code_files(CODE_SUFFIXES | {".md"})
        if VERBATIM not in p.parents and p != Path(__file__).resolve()
    ]
    found = [
        f"{p.relative_to(ROOT)}:{n}: {m.group(0)}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        for m in OUTSIDE.finditer(line)
    ]
    assert not found, "names of documents the repository does not hold:\n" + "\n".join(found)
