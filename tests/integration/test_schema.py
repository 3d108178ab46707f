"""The schema: migrations apply, roll back and re-apply; functions, owners and privileges
re-apply without change; concurrent migrate runs don't corrupt; enums agree with Python;
constraints and triggers state the invariants for every write path, plain SQL included."""

from __future__ import annotations

import concurrent.futures
import re
import uuid
from pathlib import Path

import psycopg
import pytest

from arm_core import cli
from arm_core.devtools.testbed.sql import (
    MIGRATIONS,
    Conn,
    ack,
    dict_conn,
    fail_by_timeout,
    job,
    pipeline_for,
    publish,
    scalar,
    stored_file,
    upload,
)
from arm_core.migrate import migrate, rollback_to
from arm_core.statuses import FileStatus, FileType, JobStatus

pytestmark = pytest.mark.integration

CATALOG_SNAPSHOT = """
SELECT 'function', p.oid::regprocedure::text, md5(pg_get_functiondef(p.oid))
FROM pg_proc p WHERE p.pronamespace = 'arm'::regnamespace
UNION ALL
SELECT 'trigger', t.tgname, md5(pg_get_triggerdef(t.oid))
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
WHERE c.relnamespace = 'arm'::regnamespace AND NOT t.tgisinternal
UNION ALL
SELECT 'index', indexname, md5(indexdef) FROM pg_indexes WHERE schemaname = 'arm'
UNION ALL
SELECT 'constraint', conname, md5(pg_get_constraintdef(oid))
FROM pg_constraint WHERE connamespace = 'arm'::regnamespace
UNION ALL
SELECT 'column', table_name || '.' || column_name, md5(data_type || coalesce(column_default, ''))
FROM information_schema.columns WHERE table_schema = 'arm'
UNION ALL
SELECT 'privileges', 'schema arm', md5(nspowner::regrole::text || coalesce(nspacl::text, ''))
FROM pg_namespace WHERE nspname = 'arm'
UNION ALL
SELECT 'privileges', c.oid::regclass::text,
       md5(c.relowner::regrole::text || coalesce(c.relacl::text, '')
           || coalesce((SELECT string_agg(a.attname || coalesce(a.attacl::text, ''), ','
                                          ORDER BY a.attnum)
                        FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attacl IS NOT NULL),
                       ''))
FROM pg_class c WHERE c.relnamespace = 'arm'::regnamespace
UNION ALL
SELECT 'privileges', p.oid::regprocedure::text,
       md5(p.proowner::regrole::text || coalesce(p.proacl::text, ''))
FROM pg_proc p WHERE p.pronamespace = 'arm'::regnamespace
ORDER BY 1, 2
"""


def snapshot(url: str) -> list[tuple[str, str, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(CATALOG_SNAPSHOT).fetchall()


def test_migrate_empty_then_rollback_then_reapply(empty_db_url: str) -> None:
    first = migrate(empty_db_url)
    assert first.applied_migrations == MIGRATIONS
    applied = snapshot(empty_db_url)
    kinds = {kind for kind, _, _ in applied}
    assert kinds == {"function", "trigger", "index", "constraint", "column", "privileges"}

    assert rollback_to(empty_db_url, MIGRATIONS[0]) == MIGRATIONS[::-1]
    with psycopg.connect(empty_db_url) as conn:
        assert conn.execute("SELECT to_regnamespace('arm')").fetchone() == (None,)

    again = migrate(empty_db_url)
    assert again.applied_migrations == MIGRATIONS
    assert snapshot(empty_db_url) == applied


def test_arm_core_rollback_takes_the_schema_back_to_before_a_migration(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/upgrading.md's schema rollback: `arm-core rollback <id>` undoes that
    migration and every later one, newest first; migrate then brings it all back. An id
    this version does not have is exit 2, naming it, with nothing changed."""
    migrate(empty_db_url)
    applied = snapshot(empty_db_url)
    monkeypatch.setenv("DATABASE_URL", empty_db_url)
    assert cli.main(["rollback", "0099_no_such_migration"]) == 2
    assert "0099_no_such_migration" in capsys.readouterr().err
    assert snapshot(empty_db_url) == applied

    undone = MIGRATIONS.index("0013_time_ordered_ids")
    assert cli.main(["rollback", MIGRATIONS[undone]]) == 0
    said = capsys.readouterr().out
    newest_first = ", ".join(reversed(MIGRATIONS[undone:]))
    assert said.startswith(f"rolled back: {newest_first};"), said
    with dict_conn(empty_db_url) as conn:
        left = [r["id"] for r in conn.execute("SELECT migration_id AS id FROM _yoyo_migration")]
        assert sorted(left) == MIGRATIONS[:undone]
        assert scalar(conn, "SELECT to_regprocedure('arm.uuid_v7()')") is None  # 0013's
        v3 = "SELECT to_regprocedure('arm.retry_file_v3(uuid, text, uuid, text)')"
        assert scalar(conn, v3) is None  # 0015's: the v3 retries and the audit's level
        assert not scalar(
            conn,
            "SELECT count(*) FROM pg_attribute WHERE attname = 'actor_level' "
            "AND attrelid IN ('arm.retry_audit'::regclass, 'arm.archived_retry_audit'::regclass)",
        )
        assert "gen_random_uuid" in scalar(
            conn,
            "SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef "
            "WHERE adrelid = 'arm.recognition_job'::regclass AND adnum = 1",
        )
    migrate(empty_db_url)
    assert snapshot(empty_db_url) == applied


def test_migrate_twice_changes_nothing(empty_db_url: str) -> None:
    migrate(empty_db_url)
    before = snapshot(empty_db_url)
    report = migrate(empty_db_url)
    assert report.applied_migrations == []
    assert len(report.function_files) >= 6
    assert snapshot(empty_db_url) == before


def test_concurrent_migrate_runs_do_not_corrupt(empty_db_url: str) -> None:
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda _: migrate(empty_db_url), range(4)))
    assert sorted(len(r.applied_migrations) for r in reports) == [0, 0, 0, len(MIGRATIONS)]
    with psycopg.connect(empty_db_url) as conn:
        applied = conn.execute("SELECT count(*) FROM _yoyo_migration").fetchone()
    assert applied == (len(MIGRATIONS),)
    assert snapshot(empty_db_url) == snapshot(empty_db_url)  # readable and stable
    with dict_conn(empty_db_url) as conn:
        up = upload(conn)
        assert job(conn, up.job_id)["status"] == "queued"


def test_python_statuses_equal_the_database_enums(conn: Conn) -> None:
    mirrored = {
        "arm.job_status": JobStatus,
        "arm.file_status": FileStatus,
        "arm.file_type": FileType,
    }
    for db_type, py_enum in mirrored.items():
        labels = scalar(conn, f"SELECT enum_range(NULL::{db_type})::text[]")
        assert labels == [member.value for member in py_enum], db_type


def test_python_pipeline_rule_equals_the_database_one(conn: Conn) -> None:
    for file_type in FileType:
        row = conn.execute(
            "SELECT arm.pipeline_for(%s::arm.file_type)::text AS p", (file_type.value,)
        ).fetchone()
        assert row is not None
        assert row["p"] == pipeline_for(file_type), file_type


def test_plain_sql_upload_gets_defaults(conn: Conn) -> None:
    """docs/behaviour.md#interfaces: columns the upload does not name have defaults."""
    up = upload(conn, "PDF")
    row = job(conn, up.job_id)
    assert row["pipeline"] == "image"
    assert row["attempt"] == 1
    assert row["max_attempts"] == 3
    assert row["status"] == "queued"
    assert row["requested_at"] is not None
    assert row["published_at"] is None and row["finished_at"] is None


def test_new_ids_are_time_ordered_uuids(conn: Conn) -> None:
    """A new object, file and job get a version 7 uuid (RFC 9562), whether the plain-SQL
    upload leaves the id to the column default or a function draws it: the variant bits,
    version 7, and the Unix milliseconds of now in the first 48 bits, so a later id sorts
    after an earlier one (the live jobs' index entries stay on the newest pages)."""
    before_ms = int(scalar(conn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)"))
    plain = upload(conn, "PDF")
    conn.execute("SELECT pg_sleep(0.002)")
    one = conn.execute(
        "SELECT file_id, job_id FROM arm.upload_file('arm-ka', 'uploads/v7/a.pdf', 'a.pdf', 'PDF')"
    ).fetchone()
    conn.execute("SELECT pg_sleep(0.002)")
    many = conn.execute(
        "SELECT file_id, job_id FROM arm.upload_files(%s::jsonb)",
        (
            '[{"bucket": "arm-ka", "key": "uploads/v7/b.pdf", "original_name": "b.pdf",'
            ' "file_type": "PDF"}]',
        ),
    ).fetchone()
    assert one is not None and many is not None
    after_ms = int(scalar(conn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)"))
    files = [plain.file_id, one["file_id"], many["file_id"]]
    jobs = [plain.job_id, one["job_id"], many["job_id"]]
    objects = [
        r["s3_object_id"]
        for r in conn.execute(
            "SELECT s3_object_id FROM arm.stored_file WHERE id = ANY(%s)", (files,)
        ).fetchall()
    ]
    assert len(objects) == 3
    for made in [*files, *jobs, *objects]:
        assert made.version == 7, made
        assert made.variant == uuid.RFC_4122, made
        assert before_ms <= made.int >> 80 <= after_ms, made
    # In the order they were made, a millisecond apart at least.
    assert files == sorted(files) and jobs == sorted(jobs)


def test_migration_0013_defines_uuid_v7_with_the_function_file_s_body() -> None:
    """The column defaults set by 0013 call the uuid_v7 that the functions draw ids with:
    0013 and db/functions/00_helpers.sql hold the same definition."""
    db = Path(__file__).resolve().parents[2] / "db"
    pattern = r"CREATE OR REPLACE FUNCTION arm\.uuid_v7\(\).*?\n\$\$;\n"
    migration = db / "migrations" / "0013_time_ordered_ids.sql"
    [in_migration] = re.findall(pattern, migration.read_text(), re.S)
    [in_functions] = re.findall(pattern, (db / "functions" / "00_helpers.sql").read_text(), re.S)
    assert in_migration == in_functions


def test_max_attempts_default_follows_the_setting(conn: Conn) -> None:
    conn.execute("SELECT arm.set_setting('default_max_attempts', '5')")
    up = upload(conn)
    assert job(conn, up.job_id)["max_attempts"] == 5


@pytest.mark.parametrize(
    ("value", "expected"),
    [(" 7 ", 7), ("+3", 3), ("-2147483648", -2147483648), ("0002147483647", 2147483647)],
)
def test_an_integer_setting_reads_what_integer_input_reads(
    conn: Conn, value: str, expected: int
) -> None:
    conn.execute("SELECT arm.set_setting('default_max_attempts', %s)", (value,))
    assert scalar(conn, "SELECT arm.setting_int('default_max_attempts')") == expected


@pytest.mark.parametrize("value", ["", "seven", "7.5", "2147483648", "-2147483649", "1e3"])
def test_a_setting_that_is_not_an_integer_is_named_in_the_error(conn: Conn, value: str) -> None:
    """Checked, not caught: setting_int runs in every upload and has no EXCEPTION block
    (a subtransaction per call); the error is the one the cast used to be turned into."""
    conn.execute("SELECT arm.set_setting('default_max_attempts', %s)", (value,))
    with pytest.raises(
        psycopg.errors.InvalidParameterValue,
        match=r"arm\.setting default_max_attempts is not an integer",
    ):
        conn.execute("SELECT arm.setting_int('default_max_attempts')")


def test_pipeline_may_be_left_out_but_not_contradict_the_file_type(
    conn: Conn,
) -> None:
    # A file with no job yet: its first job names the wrong pipeline (checked once the
    # statement's rows are in, so for a file with a live job the unique index speaks first).
    file_id = scalar(
        conn,
        "WITH o AS (INSERT INTO arm.s3_object (bucket, key, bucket_role) "
        "VALUES ('arm-ka', 'uploads/t.xlsb', 'uploads') RETURNING id) "
        "INSERT INTO arm.stored_file (original_name, file_type, s3_object_id) "
        "SELECT 't.xlsb', 'XLSB', o.id FROM o RETURNING id",
    )
    with pytest.raises(psycopg.errors.CheckViolation, match="does not match file type XLSB"):
        conn.execute(
            "INSERT INTO arm.recognition_job (file_id, pipeline, attempt) VALUES (%s, 'image', 1)",
            (file_id,),
        )
    # Left out, it follows the file's type.
    job_id = scalar(
        conn,
        "INSERT INTO arm.recognition_job (file_id, attempt) VALUES (%s, 1) RETURNING id",
        (file_id,),
    )
    assert job(conn, job_id)["pipeline"] == "tabular"


def test_attempt_is_unique_per_file_and_one_live_job_per_file(conn: Conn) -> None:
    up = upload(conn)
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            "INSERT INTO arm.recognition_job (file_id, attempt) VALUES (%s, 1)", (up.file_id,)
        )
    with pytest.raises(psycopg.errors.UniqueViolation, match="one_live_per_file"):
        conn.execute(
            "INSERT INTO arm.recognition_job (file_id, attempt) VALUES (%s, 2)", (up.file_id,)
        )


@pytest.mark.parametrize(
    "bad_update",
    [
        "SET status = 'done'",  # queued → done skips the machine
        "SET status = 'published'",  # published without its fields
        "SET finished_at = now()",  # finished_at on a live job
        "SET attempt = 0",
        "SET error_code = 'X'",
    ],
)
def test_constraints_and_guard_refuse_inconsistent_rows(conn: Conn, bad_update: str) -> None:
    up = upload(conn)
    with pytest.raises(psycopg.errors.IntegrityError):
        conn.execute(f"UPDATE arm.recognition_job {bad_update} WHERE id = %s", (up.job_id,))
    assert job(conn, up.job_id)["status"] == "queued"


def test_a_final_job_never_changes_except_group_schema(conn: Conn) -> None:
    up = upload(conn)
    fail_by_timeout(conn, up)
    before = job(conn, up.job_id)
    for change in ("status = 'done'", "error_code = 'OTHER'", "metrics = '{}'"):
        with pytest.raises(psycopg.errors.CheckViolation, match="is final"):
            conn.execute(f"UPDATE arm.recognition_job SET {change} WHERE id = %s", (up.job_id,))
    assert job(conn, up.job_id) == before
    # group_schema belongs to done/needs_check only (mapping); a timeout job refuses it too.
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(
            "UPDATE arm.recognition_job SET group_schema = '{}' WHERE id = %s", (up.job_id,)
        )


def test_current_job_must_belong_to_the_file(conn: Conn) -> None:
    a, b = upload(conn), upload(conn)
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        conn.execute(
            "UPDATE arm.stored_file SET current_recognition_job_id = %s WHERE id = %s",
            (b.job_id, a.file_id),
        )


def test_hot_queries_have_partial_indexes(conn: Conn) -> None:
    rows = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'arm' "
        "AND tablename = 'recognition_job'"
    ).fetchall()
    defs = {r["indexname"]: r["indexdef"] for r in rows}
    # The claims' ORDER BY, so LIMIT stops the scan (0002).
    assert "(requested_at, id) WHERE (status = 'queued'" in defs["recognition_job_queued_idx"]
    assert (
        "(last_published_at, id) WHERE (status = 'published'" in defs["recognition_job_unacked_idx"]
    )
    assert "reply_deadline" in defs["recognition_job_live_deadline_idx"]
    assert "WHERE" in defs["recognition_job_live_deadline_idx"]
    assert "UNIQUE" in defs["recognition_job_one_live_per_file_idx"]


def test_stored_file_pages_keep_room_for_hot_status_updates(conn: Conn) -> None:
    """Migration 0003: stored_file has fillfactor 70, so a file's status changes (not
    indexed) can stay on their page and write no index entries; rolled back, the
    default again."""
    reloptions = "SELECT reloptions FROM pg_class WHERE oid = 'arm.stored_file'::regclass"
    assert scalar(conn, reloptions) == ["fillfactor=70"]


FILE_UPDATES = (
    "SELECT pg_stat_get_xact_tuples_updated('arm.stored_file'::regclass) AS updated,"
    " pg_stat_get_xact_tuples_hot_updated('arm.stored_file'::regclass) AS hot"
)


def test_a_file_s_updates_after_its_upload_write_no_index_entries(conn: Conn) -> None:
    """Migration 0008: the upload's current-job update and the ack's status change are
    HOT (no index names current_recognition_job_id or status; the failed files' index
    reads the generated `failed`); a failure, which sets `failed`, is not. Counted by
    PostgreSQL for this transaction."""
    with conn.transaction():
        up = upload(conn)  # its UPDATE of current_recognition_job_id
        publish(conn)
        ack(conn, up.job_id, up.file_id)  # UPLOADED → PROCESSING
        assert scalar(conn, FILE_UPDATES.replace(" AS hot", "")) == 2
        row = conn.execute(FILE_UPDATES).fetchone()
        assert row is not None and (row["updated"], row["hot"]) == (2, 2)
        conn.execute(
            "UPDATE arm.recognition_job SET reply_deadline = now() - interval '1 s' WHERE id = %s",
            (up.job_id,),
        )
        conn.execute("SELECT arm.sweep_timeouts()")  # PROCESSING → ERROR: `failed` flips
        row = conn.execute(FILE_UPDATES).fetchone()
        assert row is not None and (row["updated"], row["hot"]) == (3, 2)
    assert stored_file(conn, up.file_id)["failed"] is True


def test_the_job_tables_vacuum_follows_the_churn_not_the_history(db_url: str) -> None:
    """Autovacuum starts on the job table after a fixed number of dead rows, however many
    rows the history holds: with the server's default (20 % of the table) the live queues'
    partial indexes grow with the history between two vacuums."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'arm.recognition_job'::regclass"
        ).fetchone()
    assert row is not None
    options = dict(option.split("=", 1) for option in row[0] or [])
    assert float(options.get("autovacuum_vacuum_scale_factor", "0.2")) == 0
    assert 0 < int(options.get("autovacuum_vacuum_threshold", "0")) <= 10_000


def test_every_row_of_a_many_row_insert_is_checked(conn: Conn) -> None:
    """The new jobs' and the sources' checks run once per statement over all its rows:
    the one bad row among many is refused, naming it, and the statement writes nothing."""
    objects = [
        scalar(
            conn,
            "INSERT INTO arm.s3_object (bucket, key, bucket_role) "
            "VALUES ('arm-ka', %s, %s) RETURNING id",
            (f"{role}/{i}.pdf", role),
        )
        for i, role in enumerate(["uploads", "uploads", "results"])
    ]
    files = "SELECT count(*) FROM arm.stored_file"
    with pytest.raises(psycopg.errors.CheckViolation) as refused:
        conn.execute(
            "INSERT INTO arm.stored_file (original_name, file_type, s3_object_id) "
            "SELECT 'f.pdf', 'PDF', o FROM unnest(%s::uuid[]) o",
            (objects,),
        )
    assert f"its source object {objects[2]} is a results object" in str(refused.value)
    assert scalar(conn, files) == 0
    file_ids = [
        scalar(
            conn,
            "INSERT INTO arm.stored_file (original_name, file_type, s3_object_id) "
            "VALUES ('f.pdf', 'PDF', %s) RETURNING id",
            (o,),
        )
        for o in objects[:2]
    ]
    jobs = "SELECT count(*) FROM arm.recognition_job"
    wrong = f"pipeline tabular does not match file type PDF of file {file_ids[0]}"
    with pytest.raises(psycopg.errors.CheckViolation, match=wrong):
        conn.execute(
            "INSERT INTO arm.recognition_job (file_id, attempt, pipeline) "
            "SELECT f, 1, CASE WHEN f = %s THEN 'tabular' ELSE 'image' END::arm.pipeline "
            "FROM unnest(%s::uuid[]) f",
            (file_ids[0], file_ids),
        )
    assert scalar(conn, jobs) == 0
