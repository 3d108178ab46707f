"""docs/upgrading.md's table of the migrations that hold writers back is what the
migrations do: each migration that, on a table an earlier migration created, builds an
index without CONCURRENTLY, checks a new constraint (not NOT VALID), rewrites the table
(a stored generated column, a column's new type), makes a column NOT NULL, updates or
deletes every row, takes LOCK TABLE, or says `-- locks:` for a lock taken on its behalf
(the function files' first counts after 0004), is in the table, and nothing else is.
The page's rollback example names the first migration the previous release lacks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.previous_release import names

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = ROOT / "db" / "migrations"
PAGE = ROOT / "docs" / "upgrading.md"
SECTION = "### Migrations that hold writers back"

_CREATE_TABLE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?arm\.(\w+)", re.I)
_INDEX = re.compile(
    r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\s+(?!CONCURRENTLY\b)(?:IF\s+NOT\s+EXISTS\s+)?\w+\s+"
    r"ON\s+(?:ONLY\s+)?arm\.(\w+)",
    re.I,
)
_ALTER = re.compile(
    r"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?arm\.(\w+)(.*?);", re.I | re.S
)
_WRITE_ALL = re.compile(r"\b(UPDATE|DELETE\s+FROM)\s+(?:ONLY\s+)?arm\.(\w+)\b([^;]*);", re.I)
_LOCK = re.compile(r"\bLOCK\s+(?:TABLE\s+)?(?:ONLY\s+)?arm\.(\w+)", re.I)
_DECLARED = re.compile(r"^--\s*locks:\s*(.+)$", re.M)


def migrations() -> list[Path]:
    return sorted(p for p in MIGRATIONS.glob("*.sql") if not p.name.endswith(".rollback.sql"))


def without_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def clauses(body: str) -> list[str]:
    """An ALTER TABLE's actions: its text split at the commas outside parentheses."""
    found, depth, start = [], 0, 0
    for i, c in enumerate(body):
        depth += {"(": 1, ")": -1}.get(c, 0)
        if c == "," and depth == 0:
            found.append(body[start:i])
            start = i + 1
    return [*found, body[start:]]


def holds_writers_back(sql: str, existing: set[str]) -> list[str]:
    """What in a migration holds writers of a table `existing` (created earlier) back
    for a time that grows with it."""
    code = without_comments(sql)
    why = [f"declares: {m[1].strip()}" for m in _DECLARED.finditer(sql)]
    why += [f"an index on {t} without CONCURRENTLY" for t in _INDEX.findall(code) if t in existing]
    for table, body in _ALTER.findall(code):
        if table not in existing:
            continue
        for action in (" ".join(c.split()).upper() for c in clauses(body)):
            if re.search(r"\bGENERATED\b.*\bSTORED\b", action):
                why.append(f"a stored generated column rewrites {table}")
            elif re.search(r"\bALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE\b", action):
                why.append(f"a column's new type rewrites {table}")
            elif re.search(r"\bSET\s+NOT\s+NULL\b", action):
                why.append(f"NOT NULL checks every row of {table}")
            elif re.search(
                r"\bADD\s+(CONSTRAINT\s+\w+\s+)?(CHECK|FOREIGN\s+KEY|UNIQUE|PRIMARY\s+KEY)\b",
                action,
            ) and not action.endswith("NOT VALID"):
                why.append(f"a constraint checked on every row of {table}")
    for verb, table, rest in _WRITE_ALL.findall(code):
        if table in existing and not re.search(r"\bWHERE\b", rest, re.I):
            why.append(f"{verb.upper()} of every row of {table}")
    why += [f"LOCK TABLE {t}" for t in _LOCK.findall(code) if t in existing]
    return why


def found_on_disk() -> dict[str, list[str]]:
    existing: set[str] = set()
    found: dict[str, list[str]] = {}
    for path in migrations():
        sql = path.read_text(encoding="utf-8")
        why = holds_writers_back(sql, existing)
        if why:
            found[path.stem] = why
        existing |= {t.lower() for t in _CREATE_TABLE.findall(without_comments(sql))}
    return found


def listed_on_the_page() -> list[str]:
    page = PAGE.read_text(encoding="utf-8")
    _, found, rest = page.partition(f"\n{SECTION}\n")
    assert found, f"docs/upgrading.md has no section {SECTION!r}"
    section = re.split(r"^#{1,3} ", rest, maxsplit=1, flags=re.M)[0]
    return re.findall(r"^\| `(\d{4}_\w+)` \|", section, re.M)


def test_the_page_lists_every_migration_that_holds_writers_back_and_no_other() -> None:
    found = found_on_disk()
    listed = listed_on_the_page()
    assert listed == sorted(listed), "keep the table in migration order"
    missing = {m: why for m, why in found.items() if m not in listed}
    assert not missing, f"docs/upgrading.md's table lacks: {missing}"
    extra = [m for m in listed if m not in found]
    assert not extra, f"docs/upgrading.md lists what holds no writer back (or no such id): {extra}"


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("CREATE INDEX i ON arm.t (a);", ["an index on t without CONCURRENTLY"]),
        ("CREATE INDEX CONCURRENTLY i ON arm.t (a);", []),
        ("CREATE TABLE arm.u (a int); CREATE INDEX i ON arm.u (a);", []),
        (
            "ALTER TABLE arm.t\n    ADD COLUMN f boolean GENERATED ALWAYS AS (s = 'E') STORED;",
            ["a stored generated column rewrites t"],
        ),
        ("ALTER TABLE arm.t ALTER COLUMN a TYPE bigint;", ["a column's new type rewrites t"]),
        ("ALTER TABLE arm.t ALTER COLUMN a SET NOT NULL;", ["NOT NULL checks every row of t"]),
        ("ALTER TABLE arm.t ALTER COLUMN a SET DEFAULT 1;", []),
        ("ALTER TABLE arm.t ADD COLUMN a uuid, ADD CONSTRAINT c CHECK (a IS NULL) NOT VALID;", []),
        (
            "ALTER TABLE arm.t ADD CONSTRAINT c CHECK (char_length(a, b) < 3);",
            ["a constraint checked on every row of t"],
        ),
        ("UPDATE arm.t SET a = 1;", ["UPDATE of every row of t"]),
        ("UPDATE arm.t SET a = 1 WHERE status = 'queued';", []),
        ("DELETE FROM arm.t;", ["DELETE FROM of every row of t"]),
        ("LOCK TABLE arm.t IN SHARE MODE;", ["LOCK TABLE t"]),
        (
            "-- locks: the counts, under a lock\nCREATE TABLE arm.c (n int);",
            ["declares: the counts, under a lock"],
        ),
        ("-- CREATE INDEX i ON arm.t (a) in a comment\nSELECT 1;", []),
        (
            "DO $$ BEGIN EXECUTE format('CREATE INDEX IF NOT EXISTS i ON arm.t"
            " USING gin (a)'); END $$;",
            ["an index on t without CONCURRENTLY"],
        ),
    ],
)
def test_what_holds_writers_back(sql: str, why: list[str]) -> None:
    assert holds_writers_back(sql, {"t"}) == why


def test_the_rollback_example_names_the_first_migration_the_previous_release_lacks() -> None:
    previous = {
        Path(n).stem for n in names("arm_core/sql/migrations/") if not n.endswith(".rollback.sql")
    }
    first_new = next(p.stem for p in migrations() if p.stem not in previous)
    page = PAGE.read_text(encoding="utf-8")
    assert re.findall(r"arm-core rollback (\d{4}_\w+)", page) == [first_new]
