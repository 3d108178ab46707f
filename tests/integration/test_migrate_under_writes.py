"""`arm-core migrate` under a flow of writes (a rolling deploy runs it so): re-applying the
functions re-creates the triggers of two tables, and takes their locks without ever
waiting for a write, so no write dies in a deadlock with it.

A write that holds one of the tables and then asks for the other is what an upload
does (stored_file before recognition_job); a migrate that takes the two one after the
other meets it in a deadlock, and PostgreSQL kills one of the two."""

from __future__ import annotations

import re
import threading
import time

import psycopg
import pytest

from arm_core.migrate import SQL_DIR, TRIGGER_TABLES, apply_functions, function_files

pytestmark = pytest.mark.integration


def test_the_locked_tables_are_every_table_a_function_file_makes_triggers_on() -> None:
    named: set[str] = set()
    for path in function_files(SQL_DIR):
        text = path.read_text(encoding="utf-8")
        for statement in re.findall(r"CREATE (?:OR REPLACE )?TRIGGER\b.*?;", text, re.S):
            table = re.search(r"\bON arm\.(\w+|%1\$I)", statement)
            assert table is not None, statement
            named.add(table.group(1))
        # Triggers made in a loop over table names (80_status.sql).
        for names in re.findall(r"IN ARRAY ARRAY\[([^]]*)\] LOOP", text):
            named |= {n.strip(" '") for n in names.split(",")}
    named.discard("%1$I")
    assert {f"arm.{n}" for n in named} == set(TRIGGER_TABLES)


def test_a_write_holding_one_table_and_asking_for_the_other_is_not_killed(db_url: str) -> None:
    applied: list[object] = []

    def migrating() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            try:
                applied.append(apply_functions(conn, SQL_DIR))
            except psycopg.Error as exc:
                applied.append(exc)

    with psycopg.connect(db_url) as write:
        # An upload's order: stored_file first, then recognition_job.
        write.execute("LOCK TABLE arm.stored_file IN ROW EXCLUSIVE MODE")
        migrate = threading.Thread(target=migrating)
        migrate.start()
        # Migrate tries meanwhile (a deadlock needs it to hold recognition_job while
        # waiting for stored_file: PostgreSQL looks for one after a second of waiting).
        time.sleep(1.5)
        write.execute("SET LOCAL lock_timeout = '10s'")
        write.execute("LOCK TABLE arm.recognition_job IN ROW EXCLUSIVE MODE")
        write.commit()
    migrate.join(timeout=60)
    assert not migrate.is_alive()
    assert applied and isinstance(applied[0], list), applied
    assert "10_triggers.sql" in applied[0]


def test_no_moment_without_writes_within_its_patience_changes_nothing(db_url: str) -> None:
    with psycopg.connect(db_url) as write, psycopg.connect(db_url, autocommit=True) as conn:
        write.execute("LOCK TABLE arm.stored_file IN ROW EXCLUSIVE MODE")
        began = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable):
            apply_functions(conn, SQL_DIR, patience=0.5)
        assert time.monotonic() - began >= 0.5
        write.rollback()
        # The tables free, it applies at once.
        assert "10_triggers.sql" in apply_functions(conn, SQL_DIR, patience=0.0)
