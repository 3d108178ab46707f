"""db/schema.sql: the schema a fresh `arm-core migrate` leaves, as pg_dump writes it.

The snapshot is checked in so that a reviewer sees, in the diff of db/schema.sql, what a
change to db/migrations, db/functions or db/grants.sql does to the schema (tables,
indexes, constraints, function signatures and bodies, triggers, owners and privileges);
tests/integration/test_schema_snapshot.py fails when the snapshot and the migrations
disagree. See db/README.md.

    python -m arm_core.devtools.schema_snapshot            # print the snapshot
    python -m arm_core.devtools.schema_snapshot --write    # rewrite db/schema.sql
    python -m arm_core.devtools.schema_snapshot --check    # exit 1 with a diff if stale

By default it migrates a database of an embedded PostgreSQL of its own (the binaries of
`find_pg_bindir`, as the test suite uses); with ``--database-url`` it creates a scratch
database on that server instead, migrates and dumps it, and drops it again (the database
of the URL itself is only used to connect, never changed).

The dump is `pg_dump --schema-only --schema=arm`: yoyo's own tables live in `public` and
stay out. Owners and privileges are in it, so a review sees a grant change too; they name
only the roles of db/roles.sql (db/grants.sql gives everything to arm_owner, never to the
user who migrated). It is normalised so that it is the same run to run: pg_dump's version
lines, its session `SET`s and its random `\\restrict` tokens go, and a header names the
PostgreSQL major version that produced it (pg_dump's output differs between majors; the
one difference between 15 and 18 for this schema, 18's generated names of NOT NULL
constraints, is taken out).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from arm_core.devtools.embedded_postgres import EmbeddedPostgres, find_pg_bindir
from arm_core.devtools.generated import CHECKOUT, write_or_check
from arm_core.migrate import migrate

# The project's schemas: everything the migrations and functions create lives in `arm`.
SCHEMAS = ("arm",)
# db/schema.sql of the checkout: it is no package data (arm_core.sql holds what migrate
# reads), so it is not beside the installed SQL.
SNAPSHOT_PATH = CHECKOUT / "db" / "schema.sql"
REGENERATE = "python -m arm_core.devtools.schema_snapshot --write"

# Function names of schema `arm` that deliberately have more than one overload, with the
# reason. An overload is almost always an accident: CREATE OR REPLACE with an added
# parameter creates a second function beside the first (db/README.md).
ALLOWED_OVERLOADS: dict[str, str] = {}

_OVERLOADS = """
SELECT p.proname, array_agg(p.oid::regprocedure::text ORDER BY p.oid::regprocedure::text)
FROM pg_proc p
WHERE p.pronamespace = 'arm'::regnamespace
GROUP BY p.proname
HAVING count(*) > 1
ORDER BY p.proname
"""

# Lines of pg_dump's output that change run to run or say nothing about the schema.
_NOISE = re.compile(
    r"^(?:"
    r"\\(?:un)?restrict \S+"  # random per-run token (pg_dump 15.14+, 16.10+, 17.6+)
    r"|-- Dumped (?:from database|by pg_dump) version .*"
    r"|SET \w+ = .*;"  # session settings of the dump's top level (never indented)
    r"|SELECT pg_catalog\.set_config\('search_path', '', false\);"
    r")$"
)


def header(server_major: int, dump_major: int) -> str:
    return (
        "-- db/schema.sql: schema arm as a fresh `arm-core migrate` leaves it (db/migrations,\n"
        "-- then db/functions and db/grants.sql). Generated, do not edit: regenerate with\n"
        f"--     {REGENERATE}\n"
        "-- and review its diff with the change that caused it (db/README.md).\n"
        f"-- PostgreSQL {server_major}, pg_dump {dump_major} --schema-only --schema=arm\n"
    )


# PostgreSQL 18 names every NOT NULL constraint, and its pg_dump writes the name:
# <table>_<column>_not_null, or the name of the table it was copied from (CREATE TABLE
# … LIKE). The same schema on 15 has the constraint and no name. A name of another shape
# (one a migration chose) stays.
_GENERATED_NOT_NULL_NAME = re.compile(r"^(    (\w+) .*?) CONSTRAINT \w+_\2_not_null NOT NULL")


def normalise(dump: str, server_major: int, dump_major: int) -> str:
    """pg_dump's text without the run-to-run noise (and without PostgreSQL 18's default
    names of NOT NULL constraints), under the snapshot's header."""
    lines = [
        _GENERATED_NOT_NULL_NAME.sub(r"\1 NOT NULL", line)
        for line in dump.splitlines()
        if not _NOISE.match(line)
    ]
    text = "\n".join(lines)
    for banner in ("PostgreSQL database dump", "PostgreSQL database dump complete"):
        text = text.replace(f"--\n-- {banner}\n--\n", "")
    text = re.sub(r"\n{3,}", "\n\n\n", text).strip("\n")
    return header(server_major, dump_major) + "\n" + text + "\n"


def pg_dump_path() -> Path:
    return find_pg_bindir() / "pg_dump"


def _major(version_num: int) -> int:
    return version_num // 10000


def dump_schema(database_url: str) -> str:
    """The normalised schema-only dump of the project's schemas of database_url."""
    tool = pg_dump_path()
    args = [str(tool), "--schema-only"]
    args += [f"--schema={schema}" for schema in SCHEMAS]
    result = subprocess.run(
        [*args, f"--dbname={database_url}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pg_dump failed (exit {result.returncode}): {result.stderr}")
    version = subprocess.run(
        [str(tool), "--version"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    found = re.search(r"\)\s+(\d+)", version) or re.search(r"(\d+)", version)
    if found is None:
        raise RuntimeError(f"cannot read pg_dump's version from {version!r}")
    with psycopg.connect(database_url) as conn:
        server = conn.info.server_version
    return normalise(result.stdout, _major(server), int(found.group(1)))


def overloads(database_url: str) -> dict[str, list[str]]:
    """Function names of schema arm with more than one overload → their signatures,
    except those listed in ALLOWED_OVERLOADS."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(_OVERLOADS).fetchall()
    return {name: list(sigs) for name, sigs in rows if name not in ALLOWED_OVERLOADS}


def _with_dbname(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


@contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server of server_url, dropped afterwards."""
    name = f"arm_schema_snapshot_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _with_dbname(server_url, name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextmanager
def migrated_database(server_url: str | None = None) -> Iterator[str]:
    """A freshly migrated scratch database: on server_url's server, or on an embedded
    PostgreSQL started (and removed) for the purpose."""
    if server_url is not None:
        with scratch_database(server_url) as url:
            migrate(url)
            yield url
        return
    with tempfile.TemporaryDirectory(prefix="arm-schema-snapshot-") as base:
        server = EmbeddedPostgres(base_dir=Path(base))
        try:
            server.start()
            with scratch_database(server.url()) as url:
                migrate(url)
                yield url
        finally:
            server.destroy()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m arm_core.devtools.schema_snapshot",
        description="The schema of a freshly migrated database, as db/schema.sql holds it.",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"rewrite {SNAPSHOT_PATH.name}")
    mode.add_argument(
        "--check",
        action="store_true",
        help="exit 1 with a diff when db/schema.sql is stale or schema arm has overloads",
    )
    parser.add_argument(
        "--database-url",
        help="migrate a scratch database on this server (created and dropped) instead of "
        "starting an embedded PostgreSQL",
    )
    args = parser.parse_args(argv)

    with migrated_database(args.database_url) as url:
        actual = dump_schema(url)
        found = overloads(url)

    for name, signatures in found.items():
        print(f"overloaded function arm.{name}: {', '.join(signatures)}", file=sys.stderr)
    stale = write_or_check(
        SNAPSHOT_PATH, actual, write=args.write, check=args.check,
        source="migrated database", regenerate=REGENERATE,
    )  # fmt: skip
    return 1 if stale or (args.check and found) else 0


if __name__ == "__main__":
    sys.exit(main())
