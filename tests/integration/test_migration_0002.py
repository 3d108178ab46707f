"""Migration 0002 on a database of the previous release that holds data: it
applies without touching the data, its constraints hold from then on, and it rolls back.
Also the upload bounds it adds, as an uploader meets them."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb
from yoyo import get_backend, read_migrations

from arm_core.db import query
from arm_core.devtools.testbed.sql import (
    DEAD_LETTER_UNPUBLISHABLE,
    MIGRATIONS,
    Conn,
    Upload,
    ack,
    dict_conn,
    fail_by_no_ack,
    fail_by_timeout,
    job,
    publish,
    result,
    scalar,
    stored_file,
    upload,
)
from arm_core.migrate import SQL_DIR, apply_functions, ensure_roles, migrate, yoyo_url

pytestmark = pytest.mark.integration

M1, M2 = "0001_core_schema", "0002_unpublishable_dlq_bounds_scan_indexes"
# What a migrate applies on top of an 0001 database: 0002 and every later migration.
LATER = MIGRATIONS[1:]
TABLES = ("s3_object", "stored_file", "recognition_job", "retry_audit")
BOUNDS = {  # constraint → its table
    "s3_object_bucket_length": "s3_object",
    "s3_object_key_length": "s3_object",
    "stored_file_original_name_length": "stored_file",
}
TOO_LONG_NAME = "Оборотно-сальдовая ведомость " * 60 + ".xlsx"  # 1,745 characters


def _yoyo(url: str, ids: Iterable[str], rollback: bool = False) -> list[str]:
    """Applies (or rolls back) just the named migrations, as yoyo records them."""
    wanted = set(ids)
    backend = get_backend(yoyo_url(url))
    try:
        with backend.lock():
            migrations = read_migrations(str(SQL_DIR / "migrations")).filter(
                lambda m: m.id in wanted
            )
            if rollback:
                todo = backend.to_rollback(migrations)
                backend.rollback_migrations(todo)
            else:
                todo = backend.to_apply(migrations)
                backend.apply_migrations(todo)
        return [m.id for m in todo]
    finally:
        backend.connection.close()


def _retry_as_0001_did(conn: Conn, file_id: uuid.UUID) -> None:
    """What a retry wrote at 0001: a new queued attempt, the file switched to it, and its
    audit record. (Today's retry functions also write the audit's actor_level, which
    0015 adds, so they cannot run on this database.)"""
    with conn.transaction():
        old = conn.execute(
            "SELECT j.* FROM arm.recognition_job j JOIN arm.stored_file f "
            "ON j.id = f.current_recognition_job_id WHERE f.id = %s FOR UPDATE OF f",
            (file_id,),
        ).fetchone()
        assert old is not None
        new_id = scalar(
            conn,
            "INSERT INTO arm.recognition_job "
            "(file_id, pipeline, attempt, max_attempts, status, requested_at) "
            "VALUES (%s, %s, %s, %s, 'queued', clock_timestamp()) RETURNING id",
            (file_id, old["pipeline"], old["attempt"] + 1, old["max_attempts"]),
        )
        conn.execute(
            "UPDATE arm.stored_file SET current_recognition_job_id = %s, status = 'UPLOADED' "
            "WHERE id = %s",
            (new_id, file_id),
        )
        conn.execute(
            "INSERT INTO arm.retry_audit (file_id, old_job_id, new_job_id, new_attempt, actor) "
            "VALUES (%s, %s, %s, %s, 'operator')",
            (file_id, old["id"], new_id, old["attempt"] + 1),
        )


def _old_release_with_data(url: str) -> dict[str, Upload]:
    """A database at 0001 with uploads in every state. The functions applied are today's
    (they need nothing of 0002, and every write they make here is one the previous
    release made too, but for pacing's lane and samples, whose column and table are there
    only meanwhile), but for the retry, written as 0001's retry wrote it; the data also
    holds an upload over the bounds 0002 adds."""
    assert _yoyo(url, [M1]) == [M1]
    with psycopg.connect(url, autocommit=True) as plain:
        ensure_roles(plain)  # as migrate does first (on a fresh server there are none)
        # Today's functions write each new job's pacing lane (a later migration's column):
        # it is there while they make the data, and goes before the migrations are run.
        plain.execute("ALTER TABLE arm.recognition_job ADD COLUMN lane uuid")
        # And the inbox's statement writes what it applied to pacing's samples.
        plain.execute(
            "CREATE TABLE arm.pace_sample (pipeline arm.pipeline, answers integer, "
            "answer_seconds float8, acks integer, ack_seconds float8)"
        )
        apply_functions(plain, SQL_DIR)
    ups: dict[str, Upload] = {}
    with dict_conn(url) as conn:
        ups["timeout"] = upload(conn)
        fail_by_timeout(conn, ups["timeout"])
        ups["no_ack"] = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
        for name in ("published", "processing", "done", "error"):
            ups[name] = upload(conn)
        publish(conn)
        ack(conn, ups["processing"].job_id, ups["processing"].file_id)
        ack(conn, ups["done"].job_id, ups["done"].file_id)
        result(conn, ups["done"].job_id, ups["done"].file_id, "done", metrics={"rows": 3})
        result(conn, ups["error"].job_id, ups["error"].file_id, "error", error=("UNREADABLE", "?"))
        _retry_as_0001_did(conn, ups["timeout"].file_id)
        ups["queued"] = upload(conn, "PDF")
        ups["too_long"] = upload(conn, name=TOO_LONG_NAME, bucket="b" * 70)
        # With the defaults trigger that reads it (migrate creates it again).
        conn.execute("ALTER TABLE arm.recognition_job DROP COLUMN lane CASCADE")
        conn.execute("DROP TABLE arm.pace_sample")
    return ups


def _data(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row, as stored (stored_file.failed, which migration 0008 adds, is derived
    from status: not data of its own; retry_audit.actor_level, which 0015 adds, is NULL
    in every row written before it, as _no_levels_recorded checks; recognition_job.lane,
    which 0016 adds, is the file's consolidation, copied for the queued jobs)."""
    with psycopg.connect(url) as conn:
        return {
            t: conn.execute(
                f"SELECT to_jsonb(x) - 'failed' - 'actor_level' - 'lane' FROM arm.{t} x ORDER BY id"
            ).fetchall()
            for t in TABLES
        }


def _no_levels_recorded(conn: Conn) -> bool:
    """The audit of retries made before 0015 records no level: nobody knows it."""
    return scalar(conn, "SELECT count(*) FROM arm.retry_audit WHERE actor_level IS NOT NULL") == 0


def _constraints(conn: Conn) -> dict[str, bool]:
    """Constraint name → whether it is validated."""
    rows = conn.execute(
        "SELECT conname, convalidated FROM pg_constraint "
        "WHERE connamespace = 'arm'::regnamespace AND contype = 'c'"
    ).fetchall()
    return {r["conname"]: r["convalidated"] for r in rows}


def _index_def(conn: Conn, name: str) -> str:
    return str(scalar(conn, "SELECT indexdef FROM pg_indexes WHERE indexname = %s", (name,)))


def test_0002_applies_to_a_database_with_data_and_its_constraints_hold(
    empty_db_url: str,
) -> None:
    ups = _old_release_with_data(empty_db_url)
    before = _data(empty_db_url)

    assert migrate(empty_db_url).applied_migrations == LATER
    assert _data(empty_db_url) == before  # not a row changed

    with dict_conn(empty_db_url) as conn:
        assert _no_levels_recorded(conn)
        constraints = _constraints(conn)
        assert constraints["recognition_job_published_fields"] is True
        assert constraints["recognition_job_republish_only_when_published"] is True
        # NOT VALID: the old row over the bounds is kept, new rows are checked.
        assert {name: constraints[name] for name in BOUNDS} == dict.fromkeys(BOUNDS, False)
        assert "(requested_at, id)" in _index_def(conn, "recognition_job_queued_idx")
        assert "(last_published_at, id)" in _index_def(conn, "recognition_job_unacked_idx")

        # The old jobs carry on under the new functions.
        rows = conn.execute(
            query("apply_envelopes"),
            {
                "envelopes": Jsonb(
                    [
                        {
                            "job_id": str(ups["published"].job_id),
                            "file_id": str(ups["published"].file_id),
                            "status": "processing",
                            "service_name": "tabular-parser",
                            "service_version": "1",
                        },
                        {
                            "job_id": str(ups["processing"].job_id),
                            "file_id": str(ups["processing"].file_id),
                            "msg_id": "result:1",
                            "status": "error",
                            "service_name": "tabular-parser",
                            "error_code": "UNREADABLE",
                        },
                    ]
                )
            },
        ).fetchall()
        assert [r["outcome"] for r in rows] == ["applied", "applied"]
        moved = conn.execute(
            DEAD_LETTER_UNPUBLISHABLE,
            {"job_ids": [ups["queued"].job_id], "error_codes": ["X"], "error_messages": [None]},
        ).fetchall()
        assert len(moved) == 1 and stored_file(conn, ups["queued"].file_id)["status"] == "ERROR"

        # The old row over the bounds: a DBA shortens it, then validates the constraints.
        too_long = ups["too_long"]
        with pytest.raises(psycopg.errors.CheckViolation, match="original_name_length"):
            conn.execute(
                "ALTER TABLE arm.stored_file VALIDATE CONSTRAINT stored_file_original_name_length"
            )
        # (Until then the row cannot be updated: a NOT VALID constraint checks updates.)
        with pytest.raises(psycopg.errors.CheckViolation, match="original_name_length"):
            conn.execute(
                "UPDATE arm.stored_file SET status = 'ERROR' WHERE id = %s", (too_long.file_id,)
            )
        conn.execute(
            "UPDATE arm.stored_file SET original_name = left(original_name, 1024) WHERE id = %s",
            (too_long.file_id,),
        )
        conn.execute(
            "UPDATE arm.s3_object SET bucket = 'arm-ka', key = left(key, 1024) WHERE id = %s",
            (too_long.s3_object_id,),
        )
        for name, table in BOUNDS.items():
            conn.execute(f"ALTER TABLE arm.{table} VALIDATE CONSTRAINT {name}")
        assert {name: _constraints(conn)[name] for name in BOUNDS} == dict.fromkeys(BOUNDS, True)


def test_0002_rolls_back_with_data_and_applies_again(empty_db_url: str) -> None:
    ups = _old_release_with_data(empty_db_url)
    before = _data(empty_db_url)
    with dict_conn(empty_db_url) as conn:
        old = {
            "queued": _index_def(conn, "recognition_job_queued_idx"),
            "unacked": _index_def(conn, "recognition_job_unacked_idx"),
        }
        old_constraints = _constraints(conn)
    assert migrate(empty_db_url).applied_migrations == LATER

    assert _yoyo(empty_db_url, LATER, rollback=True) == LATER[::-1]
    assert _data(empty_db_url) == before
    with dict_conn(empty_db_url) as conn:
        assert _constraints(conn) == old_constraints  # all validated again, bounds gone
        assert _index_def(conn, "recognition_job_queued_idx") == old["queued"]
        assert _index_def(conn, "recognition_job_unacked_idx") == old["unacked"]

    # Again, now with a job dead-lettered before it was ever published: the rollback
    # keeps it and restores the 0001 publish-field constraint NOT VALID.
    assert migrate(empty_db_url).applied_migrations == LATER
    with dict_conn(empty_db_url) as conn:
        conn.execute(
            DEAD_LETTER_UNPUBLISHABLE,
            {"job_ids": [ups["queued"].job_id], "error_codes": ["X"], "error_messages": [None]},
        )
    assert _yoyo(empty_db_url, LATER, rollback=True) == LATER[::-1]
    with dict_conn(empty_db_url) as conn:
        constraints = _constraints(conn)
        assert constraints["recognition_job_published_fields"] is False
        assert job(conn, ups["queued"].job_id)["status"] == "dlq"
        # New rows are still checked against it.
        with pytest.raises(psycopg.errors.CheckViolation, match="published_fields"):
            conn.execute(
                "UPDATE arm.recognition_job SET published_at = NULL WHERE id = %s",
                (ups["published"].job_id,),
            )
    assert migrate(empty_db_url).applied_migrations == LATER
    with dict_conn(empty_db_url) as conn:
        assert _constraints(conn)["recognition_job_published_fields"] is True


# --- the upload bounds, as an uploader meets them --------------------------------------


def _insert_object(conn: Conn, bucket: str = "arm-ka", key: str | None = None) -> uuid.UUID:
    row = conn.execute(
        "INSERT INTO arm.s3_object (bucket, key, bucket_role) VALUES (%s, %s, 'uploads') "
        "RETURNING id",
        (bucket, key or f"uploads/{uuid.uuid4()}"),
    ).fetchone()
    assert row is not None
    return uuid.UUID(str(row["id"]))


def _insert_file(conn: Conn, name: str) -> None:
    conn.execute(
        "INSERT INTO arm.stored_file (original_name, file_type, s3_object_id) "
        "VALUES (%s, 'XLSX', %s)",
        (name, _insert_object(conn)),
    )


def test_a_file_name_over_1024_characters_is_refused_by_name(conn: Conn) -> None:
    _insert_file(conn, "я" * 1024)  # characters, not bytes (as the JSON Schema counts)
    with pytest.raises(psycopg.errors.CheckViolation, match="stored_file_original_name_length"):
        _insert_file(conn, "я" * 1025)


def test_an_s3_key_over_1024_characters_is_refused_by_name(conn: Conn) -> None:
    _insert_object(conn, key="k" * 1024)
    with pytest.raises(psycopg.errors.CheckViolation, match="s3_object_key_length"):
        _insert_object(conn, key="k" * 1025)


def test_a_bucket_name_over_63_characters_is_refused_by_name(conn: Conn) -> None:
    _insert_object(conn, bucket="b" * 63)
    with pytest.raises(psycopg.errors.CheckViolation, match="s3_object_bucket_length"):
        _insert_object(conn, bucket="b" * 64)


def test_an_upload_within_the_bounds_builds_a_request_within_the_contract(conn: Conn) -> None:
    up = upload(conn, name="x" * 900 + ".xlsx", bucket="b" * 63)
    [claimed] = publish(conn)
    assert claimed["job_id"] == up.job_id
    assert len(claimed["request"]["original_name"]) == 905
    assert len(claimed["request"]["s3"]["bucket"]) == 63
