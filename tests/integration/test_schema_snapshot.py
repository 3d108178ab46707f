"""db/schema.sql is what the migrations and functions produce, and schema arm has no
accidental overloads (db/README.md: how to change a function)."""

from __future__ import annotations

import psycopg
import pytest

from arm_core.devtools.generated import diff
from arm_core.devtools.schema_snapshot import (
    ALLOWED_OVERLOADS,
    REGENERATE,
    SNAPSHOT_PATH,
    dump_schema,
    normalise,
    overloads,
)
from arm_core.migrate import migrate

pytestmark = pytest.mark.integration


def assert_matches_snapshot(url: str, what: str) -> None:
    """Fails with a unified diff when the schema of url is not db/schema.sql."""
    expected = SNAPSHOT_PATH.read_text(encoding="utf-8")
    actual = dump_schema(url)
    # The header's fifth line names the majors that wrote it: db/schema.sql is written on
    # PostgreSQL 15, and the suite runs on 18 too (ARM_TEST_PG), where the normalised
    # dump of the same schema is the same below that line.
    versions = expected.splitlines()[4:5] != actual.splitlines()[4:5]
    if versions:
        lines = actual.splitlines(keepends=True)
        actual = "".join([*lines[:4], *expected.splitlines(keepends=True)[4:5], *lines[5:]])
    changes = diff(expected, actual, "db/schema.sql", what)
    if not changes:
        return
    hint = ""
    if versions:
        hint = (
            "\n(The header's PostgreSQL versions differ: pg_dump's output changes between "
            "majors. Point PG_BINDIR at the version db/schema.sql names, or regenerate it "
            "for everyone with the new version.)"
        )
    pytest.fail(
        f"{what} does not match db/schema.sql.\n"
        f"If the change to db/migrations or db/functions is intended, regenerate it with\n"
        f"    {REGENERATE}\n"
        f"and review the diff as part of the change (db/README.md).{hint}\n\n{changes}",
        pytrace=False,
    )


def test_migrations_and_functions_produce_db_schema_sql(empty_db_url: str) -> None:
    migrate(empty_db_url)
    assert_matches_snapshot(empty_db_url, "a freshly migrated database")


def test_the_snapshot_is_the_same_run_to_run(db_url: str) -> None:
    first = dump_schema(db_url)
    assert dump_schema(db_url) == first
    assert "\\restrict" not in first
    assert "Dumped from database version" not in first
    assert "\nSET " not in first


def test_normalise_drops_pg_dump_noise_only() -> None:
    dump = (
        "--\n-- PostgreSQL database dump\n--\n\n"
        "\\restrict AbC123\n\n"
        "-- Dumped from database version 15.18\n"
        "-- Dumped by pg_dump version 15.18\n\n"
        "SET statement_timeout = 0;\n"
        "SELECT pg_catalog.set_config('search_path', '', false);\n\n\n\n\n"
        "CREATE TABLE arm.t (\n    id integer\n);\n\n\n"
        "CREATE FUNCTION arm.f() RETURNS void\n    LANGUAGE plpgsql\n    AS $$\n"
        "BEGIN\n    SET LOCAL lock_timeout = 0;\nEND;\n$$;\n\n"
        "--\n-- PostgreSQL database dump complete\n--\n\n"
        "\\unrestrict AbC123\n"
    )
    text = normalise(dump, 15, 15)
    body = text.split("\n\n", 1)[1]
    assert body == (
        "CREATE TABLE arm.t (\n    id integer\n);\n\n\n"
        "CREATE FUNCTION arm.f() RETURNS void\n    LANGUAGE plpgsql\n    AS $$\n"
        "BEGIN\n    SET LOCAL lock_timeout = 0;\nEND;\n$$;\n"
    )
    assert "PostgreSQL 15, pg_dump 15" in text.split("\n\n", 1)[0]


def test_no_function_of_schema_arm_is_overloaded(db_url: str) -> None:
    found = overloads(db_url)
    assert not found, (
        "functions of schema arm with more than one overload (adding a parameter with "
        "CREATE OR REPLACE creates a second function beside the first): "
        f"{found}. Give the new signature a new name (arm.x_v2) and drop the old one in a "
        "numbered migration a release later (db/README.md); list a deliberate overload in "
        "ALLOWED_OVERLOADS of src/arm_core/devtools/schema_snapshot.py with its reason."
    )


def test_an_added_parameter_is_caught_as_an_overload(db_url: str) -> None:
    """The trap the test above guards against: CREATE OR REPLACE with one more parameter
    leaves the old function in place and adds another."""
    assert "get_file" not in ALLOWED_OVERLOADS
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION arm.get_file(p_file_id uuid, p_verbose boolean) "
            "RETURNS jsonb LANGUAGE sql AS $$ SELECT arm.get_file(p_file_id) $$"
        )
    assert overloads(db_url) == {"get_file": ["arm.get_file(uuid)", "arm.get_file(uuid,boolean)"]}


def test_normalise_drops_the_names_postgresql_18_gives_not_null_constraints() -> None:
    dump = (
        "CREATE TABLE arm.copy (\n"
        "    id uuid DEFAULT gen_random_uuid() CONSTRAINT original_id_not_null NOT NULL,\n"
        "    n integer CONSTRAINT copy_n_not_null NOT NULL,\n"
        "    m integer CONSTRAINT m_is_required NOT NULL\n"
        ");"
    )
    body = normalise(dump, 18, 18).split("\n\n", 1)[1]
    assert body == (
        "CREATE TABLE arm.copy (\n"
        "    id uuid DEFAULT gen_random_uuid() NOT NULL,\n"
        "    n integer NOT NULL,\n"
        "    m integer CONSTRAINT m_is_required NOT NULL\n"  # a name a migration chose
        ");\n"
    )
