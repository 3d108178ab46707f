"""Per-status counts (migration 0004, db/functions/80_status.sql): arm.job_counts()
and arm.file_counts() equal a real COUNT(*) per status after random uploads, transitions,
retries, deletes and compactions, whoever wrote; the status view's figures in constructed
situations; and neither the counts nor the status view read arm.stored_file."""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from arm_core.devtools.testbed.sql import (
    Conn,
    ack,
    dict_conn,
    one_row,
    publish,
    result,
    retry,
    scalar,
    upload,
)
from arm_core.migrate import SQL_DIR, apply_functions

pytestmark = pytest.mark.integration


def counted(conn: Conn, function: str) -> dict[str, int]:
    rows = conn.execute(f"SELECT status, n FROM arm.{function}()").fetchall()
    return {r["status"]: r["n"] for r in rows}


def real(conn: Conn, table: str, enum: str) -> dict[str, int]:
    rows = conn.execute(
        f"SELECT s::text AS status, (SELECT count(*) FROM arm.{table} t WHERE t.status = s) AS n "
        f"FROM unnest(enum_range(NULL::arm.{enum})) AS s"
    ).fetchall()
    return {r["status"]: r["n"] for r in rows}


def assert_counts_are_real(conn: Conn) -> None:
    assert counted(conn, "job_counts") == real(conn, "recognition_job", "job_status")
    assert counted(conn, "file_counts") == real(conn, "stored_file", "file_status")


def live_jobs(conn: Conn, status: str) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT id, file_id, attempt FROM arm.recognition_job WHERE status = %s", (status,)
    ).fetchall()


def tour(conn: Conn) -> Iterator[None]:
    """Four files through every job status, one step at a time: queued, published, three
    processing, one dlq (never acked), one done, one error, one timed out by the sweep."""
    for _ in range(4):
        upload(conn, "XLSX")
    yield
    publish(conn, limit=4, tabular_timeout=0)
    yield
    for j in live_jobs(conn, "published")[:3]:
        ack(conn, j["id"], j["file_id"])
    yield
    conn.execute("SELECT * FROM arm.dead_letter_unacked(interval '0', 0)")
    yield
    first, second, _ = live_jobs(conn, "processing")
    result(conn, first["id"], first["file_id"], "done", attempt=first["attempt"])
    yield
    error = ("UNSUPPORTED_FORMAT", "m")
    result(conn, second["id"], second["file_id"], "error", attempt=second["attempt"], error=error)
    yield
    conn.execute("SELECT arm.sweep_timeouts()")
    yield


def held(conn: Conn) -> set[str]:
    """The job statuses some job holds now."""
    return {s for s, n in real(conn, "recognition_job", "job_status").items() if n}


def test_the_counts_equal_count_star_after_random_transitions_retries_and_compactions(
    conn: Conn,
) -> None:
    """A differential test: a set tour through every status, then 400 random steps
    through the real functions (upload, publish, ack, done/needs_check/error, sweep,
    dead-letter, retry, a DBA's DELETE), the counts compared with COUNT(*) after every
    step, compacted at random moments."""
    rng = random.Random(11)
    assert_counts_are_real(conn)
    compactions = 0
    walked: set[str] = set()
    statuses: set[str] = set()
    # First a set tour through every status, checked at each step, so the walk's
    # coverage does not hang on its path (PostgreSQL's random() and the order rows come
    # back in make that path differ from run to run).
    for _ in tour(conn):
        assert_counts_are_real(conn)
        statuses |= held(conn)
    assert statuses == {"queued", "published", "processing", "done", "error", "timeout", "dlq"}
    assert held(conn) == {"done", "error", "timeout", "dlq"}
    for _ in range(400):
        action = rng.choice(
            [
                "upload",
                "upload",
                "publish",
                "ack",
                "result",
                "sweep",
                "dlq",
                "retry",
                "delete",
                "dba_timeout",
            ]
        )
        walked.add(action)
        if action == "upload":
            # Now and then in a session that asked for counting per statement: its
            # updates (the current job's) must count the same.
            with conn.transaction():
                if rng.random() < 0.3:
                    conn.execute("SELECT set_config('arm.counting', 'statement', true)")
                for _ in range(rng.randint(1, 3)):
                    upload(conn, rng.choice(["XLSX", "PDF"]))
        elif action == "dba_timeout":
            # A DBA times out a few live jobs and fails their files by hand, one plain
            # UPDATE each (row by row counting, several rows per statement).
            with conn.transaction():
                conn.execute(
                    "UPDATE arm.recognition_job SET status = 'timeout', finished_at = now(), "
                    "error_code = 'TIMEOUT' WHERE id IN (SELECT id FROM arm.recognition_job "
                    "WHERE status IN ('published', 'processing') ORDER BY random() LIMIT 3)"
                )
                conn.execute(
                    "UPDATE arm.stored_file f SET status = 'ERROR' FROM arm.recognition_job j "
                    "WHERE j.id = f.current_recognition_job_id AND j.status = 'timeout' "
                    "AND f.status <> 'ERROR'"
                )
        elif action == "publish":
            publish(conn, limit=rng.randint(1, 5), tabular_timeout=rng.choice([0, 600]))
        elif action == "ack" and (jobs := live_jobs(conn, "published")):
            j = rng.choice(jobs)
            ack(conn, j["id"], j["file_id"])
        elif action == "result" and (jobs := live_jobs(conn, rng.choice(["processing"] * 3))):
            j = rng.choice(jobs)
            status = rng.choice(["done", "needs_check", "error"])
            error = ("UNSUPPORTED_FORMAT", "m") if status == "error" else None
            result(conn, j["id"], j["file_id"], status, attempt=j["attempt"], error=error)
        elif action == "sweep":
            conn.execute("SELECT arm.sweep_timeouts()")
        elif action == "dlq":
            conn.execute("SELECT * FROM arm.dead_letter_unacked(interval '0', 0)")
        elif action == "retry":
            failed = conn.execute(
                "SELECT f.id FROM arm.stored_file f JOIN arm.recognition_job j "
                "ON j.id = f.current_recognition_job_id "
                "WHERE j.status IN ('error', 'timeout', 'dlq')"
            ).fetchall()
            if failed:
                retry(conn, rng.choice(failed)["id"])
        elif action == "delete" and rng.random() < 0.3:
            # A DBA removes a file with its jobs (every row of it, in one transaction).
            victim = conn.execute("SELECT id FROM arm.stored_file ORDER BY random() LIMIT 1")
            row = victim.fetchone()
            if row is not None:
                with conn.transaction():
                    conn.execute(
                        "UPDATE arm.stored_file SET current_recognition_job_id = NULL "
                        "WHERE id = %s",
                        (row["id"],),
                    )
                    conn.execute("DELETE FROM arm.retry_audit WHERE file_id = %s", (row["id"],))
                    conn.execute("DELETE FROM arm.recognition_job WHERE file_id = %s", (row["id"],))
                    conn.execute("DELETE FROM arm.stored_file WHERE id = %s", (row["id"],))
        if rng.random() < 0.1:
            conn.execute("SELECT arm.compact_counts()")
            compactions += 1
            assert scalar(conn, "SELECT count(*) FROM arm.job_count_delta") == 0
        assert_counts_are_real(conn)
    conn.execute("SELECT arm.compact_counts()")
    assert_counts_are_real(conn)
    assert "dba_timeout" in walked and "upload" in walked
    assert compactions > 10


def test_a_rolled_back_statement_counts_nothing_and_truncate_resets(conn: Conn) -> None:
    upload(conn)
    with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
        upload(conn)
        conn.execute("SELECT 1 / 0")
    assert counted(conn, "job_counts")["queued"] == 1
    conn.execute("TRUNCATE arm.stored_file, arm.recognition_job, arm.retry_audit CASCADE")
    assert_counts_are_real(conn)
    assert sum(counted(conn, "job_counts").values()) == 0
    upload(conn)
    assert_counts_are_real(conn)


def test_a_status_change_costs_one_delta_row_per_statement_not_per_row(conn: Conn) -> None:
    """The publish of 50 jobs in one statement appends two rows (queued -50, published
    +50); an UPDATE that changes no status (a republish) appends none."""
    for _ in range(50):
        upload(conn)
    conn.execute("SELECT arm.compact_counts()")
    publish(conn, limit=50)
    deltas = conn.execute("SELECT status::text, n FROM arm.job_count_delta").fetchall()
    assert sorted((d["status"], d["n"]) for d in deltas) == [("published", 50), ("queued", -50)]
    ids = [j["id"] for j in live_jobs(conn, "published")]
    conn.execute("SELECT arm.mark_republished(%s::uuid[])", (ids,))
    assert scalar(conn, "SELECT count(*) FROM arm.job_count_delta") == 2


def deltas(conn: Conn, table: str) -> list[tuple[str, int]]:
    rows = conn.execute(f"SELECT status::text AS status, n FROM arm.{table}").fetchall()
    return sorted((r["status"], r["n"]) for r in rows)


def test_an_upload_appends_a_row_per_insert_and_none_for_its_current_job_update(
    conn: Conn,
) -> None:
    """The plain-SQL upload: one delta row for the file, one for the job; the UPDATE that
    sets the file's current job changes no status: the row trigger's WHEN clause keeps it
    from firing, and the statement-level one runs only when arm.counting says so."""
    conn.execute("SELECT arm.compact_counts()")
    upload(conn)
    assert deltas(conn, "job_count_delta") == [("queued", 1)]
    assert deltas(conn, "file_count_delta") == [("UPLOADED", 1)]


def test_a_dbas_update_is_counted_per_row_and_the_sweeps_per_statement(conn: Conn) -> None:
    """Six processing jobs: a DBA times out three with one plain UPDATE (three rows of
    -processing and three of +timeout), the sweep the other three (one row each way)."""
    for _ in range(6):
        upload(conn)
    publish(conn, limit=6, tabular_timeout=0)
    for j in live_jobs(conn, "published"):
        ack(conn, j["id"], j["file_id"])
    conn.execute("SELECT arm.compact_counts()")
    conn.execute(
        "UPDATE arm.recognition_job SET status = 'timeout', finished_at = now(), "
        "error_code = 'TIMEOUT' WHERE id IN (SELECT id FROM arm.recognition_job "
        "WHERE status = 'processing' ORDER BY id LIMIT 3)"
    )
    assert deltas(conn, "job_count_delta") == [("processing", -1)] * 3 + [("timeout", 1)] * 3
    conn.execute("SELECT arm.compact_counts()")
    conn.execute("SELECT arm.sweep_timeouts()")
    assert deltas(conn, "job_count_delta") == [("processing", -3), ("timeout", 3)]
    assert_counts_are_real(conn)


def test_the_counts_and_the_status_view_never_read_stored_file(db_url: str) -> None:
    """Files per status come from the counters (the table can hold millions of rows); the
    job figures read the counters and the live jobs' partial indexes. (A connection of its
    own: pg_stat_xact_* also shows a backend's earlier transactions not yet reported.)"""
    with dict_conn(db_url) as conn:
        for _ in range(5):
            upload(conn)
    with dict_conn(db_url) as reader, reader.transaction():
        reader.execute("SELECT * FROM arm.status_view(interval '30 seconds')").fetchall()
        reader.execute("SELECT * FROM arm.job_counts()").fetchall()
        reads = one_row(
            reader,
            "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) AS scans "
            "FROM pg_stat_xact_user_tables WHERE schemaname = 'arm' AND relname = 'stored_file'",
        )
    assert reads["scans"] == 0


def test_a_concurrent_writer_and_a_compaction_lose_nothing(db_url: str) -> None:
    """Compactions in one session while another uploads and publishes: every delta row
    is folded exactly once."""
    with dict_conn(db_url) as writer, dict_conn(db_url) as compactor:
        for _ in range(30):
            upload(writer)
            compactor.execute("SELECT arm.compact_counts()")
            publish(writer, limit=1)
            with compactor.transaction():
                compactor.execute("SELECT arm.compact_counts()")
                upload(writer)  # committed while the compaction's transaction is open
        compactor.execute("SELECT arm.compact_counts()")
        assert_counts_are_real(compactor)


def test_the_status_view_in_constructed_situations(conn: Conn) -> None:
    """Overdue unacked, past the deadline but not swept, the oldest queued age, and the
    last sweep with its error."""
    fresh = upload(conn)
    publish(conn)  # fresh: published now, deadline in 10 minutes
    overdue = upload(conn)
    publish(conn)
    conn.execute(
        "UPDATE arm.recognition_job SET last_published_at = clock_timestamp() - interval '1 minute'"
        " WHERE id = %s",
        (overdue.job_id,),
    )
    late = upload(conn, "PDF")
    publish(conn, image_timeout=0)  # deadline now: past it at once
    ack(conn, late.job_id, late.file_id, "scan-gateway")
    upload(conn)  # queued
    view = one_row(conn, "SELECT * FROM arm.status_view(interval '30 seconds')")
    assert view["unacked_overdue"] == 1
    assert view["past_deadline_unswept"] == 1
    assert 0 < view["oldest_queued_age_seconds"] < 3600
    assert view["jobs"] == {
        "queued": 1,
        "published": 2,
        "processing": 1,
        "done": 0,
        "needs_check": 0,
        "error": 0,
        "timeout": 0,
        "dlq": 0,
    }
    assert view["files"] == {"UPLOADED": 3, "PROCESSING": 1, "ERROR": 0}
    assert (view["last_sweep_at"], view["last_sweep_result"], view["last_sweep_error"]) == (
        None,
        None,
        None,
    )
    # The sweep runs: the late job times out; then a sweep that fails leaves its error.
    conn.execute("UPDATE arm.periodic_task SET next_run_at = clock_timestamp()")
    conn.execute("SELECT * FROM arm.run_due_tasks()")
    view = one_row(conn, "SELECT * FROM arm.status_view(interval '30 seconds')")
    assert (view["past_deadline_unswept"], view["jobs"]["timeout"]) == (0, 1)
    assert (view["last_sweep_result"], view["last_sweep_error"]) == ("1", None)
    conn.execute("CREATE FUNCTION arm.broken_sweep() RETURNS int LANGUAGE sql AS 'SELECT 1/0'")
    conn.execute(
        "UPDATE arm.periodic_task SET function_name = 'arm.broken_sweep()', "
        "next_run_at = clock_timestamp() WHERE name = 'sweep_timeouts'"
    )
    conn.execute("SELECT * FROM arm.run_due_tasks()")
    view = one_row(conn, "SELECT * FROM arm.status_view(interval '30 seconds')")
    assert view["last_sweep_result"] is None
    assert view["last_sweep_error"] == "22012: division by zero"
    assert view["last_sweep_at"] is not None
    assert fresh.job_id != uuid.UUID(int=0)


def test_the_count_trigger_function_is_defined_once() -> None:
    """db/functions/80_status.sql alone defines arm.tg_count_statuses (migration 0004
    creates only the tables; the triggers come with the function)."""
    db = Path(__file__).resolve().parents[2] / "db"
    defining = [
        path.relative_to(db).as_posix()
        for path in sorted([*db.glob("migrations/*.sql"), *db.glob("functions/*.sql")])
        if re.search(r"FUNCTION arm\.tg_count_statuses\(\)\s*RETURNS", path.read_text())
    ]
    assert defining == ["functions/80_status.sql"]


COUNT_TRIGGERS = """
SELECT count(*) FROM pg_trigger WHERE tgfoid = 'arm.tg_count_statuses()'::regprocedure
"""


def test_the_function_file_makes_the_count_triggers_and_counts_again_when_they_are_missing(
    db_url: str,
) -> None:
    """What the first migrate after migration 0004 does (and any migrate that finds a
    count trigger missing): the eight triggers are made and the counts taken from the rows,
    in the function files' transaction; a migrate that finds them changes nothing."""
    with dict_conn(db_url) as conn:
        for _ in range(3):
            upload(conn)
        publish(conn, limit=1)
        assert scalar(conn, COUNT_TRIGGERS) == 8
        conn.execute("DROP TRIGGER tg_stored_file__count_update ON arm.stored_file")
        conn.execute("DROP TRIGGER tg_recognition_job__count_insert ON arm.recognition_job")
        upload(conn)  # not counted
        conn.execute("UPDATE arm.job_count SET n = n + 7")  # and counts gone astray
        assert counted(conn, "job_counts") != real(conn, "recognition_job", "job_status")
    with psycopg.connect(db_url, autocommit=True) as plain:
        apply_functions(plain, SQL_DIR)
    with dict_conn(db_url) as conn:
        assert scalar(conn, COUNT_TRIGGERS) == 8
        assert_counts_are_real(conn)
        upload(conn)
        publish(conn)
        assert_counts_are_real(conn)
        before = conn.execute("SELECT * FROM arm.job_count ORDER BY status").fetchall()
    with psycopg.connect(db_url, autocommit=True) as plain:
        apply_functions(plain, SQL_DIR)
    with dict_conn(db_url) as conn:
        assert conn.execute("SELECT * FROM arm.job_count ORDER BY status").fetchall() == before
        assert_counts_are_real(conn)
