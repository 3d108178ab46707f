"""Scans bounded by what is due: the claims, the dead-lettering and the timeout
sweep read their indexes from a bound computed once, so what they cost follows the rows
they return — not the backlog, the live jobs or the history. Checked on the real
functions, with the plans auto_explain logs from inside them (nested statements, actual
row counts), over tens of thousands of ANALYZEd jobs of which a handful are due.

The history matters: final jobs keep their reply_deadline and last_published_at, all in
the past, so the column statistics say most deadlines have passed and the planner
estimates thousands of live jobs due where there are five. A plan chosen on that
estimate (hash joins over sequential scans of recognition_job and stored_file) reads
every job and file; the functions must stay bounded by the due rows whatever the
statistics say, so the data here has more history than live jobs."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from arm_core.db import query
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.plans import explained
from arm_core.devtools.testbed.sql import Conn, claim_params, dict_conn, publish
from tests.support.databases import clone

pytestmark = pytest.mark.integration

HISTORY = 30_000  # final jobs (timeout, dlq), published and finished days ago
LIVE = 10_000  # published jobs whose reply deadline and ack timeout are far off
BACKLOG = 10_000  # queued jobs of one upload transaction (one requested_at)
DUE = 5  # published jobs past their reply deadline and their ack timeout
ACK_TIMEOUT = 1800.0  # seconds; the due jobs went out two hours ago, the live ones now
# Rows any one scan of the job tables may touch. The due work is a handful of rows; a
# scan proportional to the live jobs or the backlog would touch thousands.
EXAMINED_MAX = 100
TABLES = {"recognition_job", "stored_file", "s3_object"}


def _bulk_upload(conn: Conn, n: int) -> None:
    """n plain-SQL uploads in one transaction (so one requested_at), set-wise."""
    with conn.transaction():
        conn.execute(
            """
            WITH o AS (
                INSERT INTO arm.s3_object (bucket, key, bucket_role)
                SELECT 'arm-ka', 'uploads/plans/' || gen_random_uuid(), 'uploads'
                FROM generate_series(1, %(n)s)
                RETURNING id, key
            ), f AS (
                INSERT INTO arm.stored_file (original_name, file_type, s3_object_id)
                SELECT o.key, 'XLSX', o.id FROM o
                RETURNING id
            )
            INSERT INTO arm.recognition_job (file_id) SELECT id FROM f
            """,
            {"n": n},
        )
        conn.execute(
            "UPDATE arm.stored_file f SET current_recognition_job_id = j.id "
            "FROM arm.recognition_job j "
            "WHERE j.file_id = f.id AND f.current_recognition_job_id IS NULL"
        )


# Publishes every queued job through the publisher's statement, in SQL (no rows to the
# client).
_PUBLISH_ALL = """
SELECT count(*) FROM arm.publish_queued_jobs_v2(
    2147483647, make_interval(secs => %(timeout)s), make_interval(secs => %(timeout)s),
    'files.tabular_uploaded', 'files.img_uploaded', 2147483647)
"""
# While a job is live its deadline and last publish may move (the fixture below does it
# for the due jobs too); spread over the past month, as a month of history would be.
_BACKDATE = """
UPDATE arm.recognition_job
SET last_published_at = last_published_at - interval '2 hours' - interval '30 days' * random(),
    reply_deadline = reply_deadline - interval '2 hours' - interval '30 days' * random()
WHERE status = 'published'
"""


def _history(conn: Conn, n: int) -> None:
    """n final jobs through the functions: uploaded, published, backdated while live,
    then half dead-lettered (dlq, no ack) and half timed out by the sweep."""
    for finish in (
        "SELECT count(*) FROM arm.dead_letter_unacked(interval '0 seconds', 0)",
        "SELECT arm.sweep_timeouts()",
    ):
        _bulk_upload(conn, n // 2)
        conn.execute(_PUBLISH_ALL, {"timeout": 0})
        conn.execute(_BACKDATE)
        conn.execute(finish)


@pytest.fixture(scope="module")
def loaded_db(pg_server: EmbeddedPostgres, template_db: str) -> Iterator[str]:
    """One database for the module (building it is the slow part): HISTORY final jobs
    whose deadlines and publishes are long past, DUE overdue published jobs, LIVE
    published jobs due in an hour, a BACKLOG of queued jobs. Every test runs its function
    in a transaction that is rolled back."""
    with clone(pg_server, "arm_plans", template_db) as url:
        with dict_conn(url) as conn:
            _history(conn, HISTORY)
            _bulk_upload(conn, DUE)
            publish(conn, limit=DUE, tabular_timeout=0)
            conn.execute(
                "UPDATE arm.recognition_job "
                "SET last_published_at = last_published_at - interval '2 hours' "
                "WHERE status = 'published'"
            )
            _bulk_upload(conn, LIVE)
            publish(conn, limit=LIVE, tabular_timeout=3600)
            _bulk_upload(conn, BACKLOG)
            # As autovacuum would: statistics that see the history, and an index free of
            # the entries the history left behind while it was live.
            for table in ("arm.recognition_job", "arm.stored_file", "arm.s3_object"):
                conn.execute(f"VACUUM ANALYZE {table}")
        yield url


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def table_of(scan: dict[str, Any]) -> str | None:
    """The job table a scan node reads: its relation, or for a Bitmap Index Scan (which
    names only its index) the table the index's name starts with."""
    if scan.get("Relation Name") in TABLES:
        return str(scan["Relation Name"])
    index = scan.get("Index Name") or ""
    return next((t for t in TABLES if index.startswith(f"{t}_")), None)


def table_scans(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every scan node of the job tables and their indexes (not the ModifyTable nodes
    that name them)."""
    return [
        n
        for plan in plans
        for n in nodes(plan)
        if n["Node Type"].endswith("Scan") and table_of(n) is not None
    ]


def examined(scan: dict[str, Any]) -> float:
    """Rows a scan node read: returned plus filtered out, over all its loops."""
    per_loop = (
        scan["Actual Rows"]
        + scan.get("Rows Removed by Filter", 0)
        + scan.get("Rows Removed by Index Recheck", 0)
    )
    return per_loop * scan["Actual Loops"]


def assert_bounded(plans: list[dict[str, Any]], at_most: int = EXAMINED_MAX) -> None:
    """No sequential scan of a job table, and no scan of one reads more than at_most."""
    scans = table_scans(plans)
    assert scans
    for scan in scans:
        where = f"{scan['Node Type']} on {table_of(scan)} ({scan.get('Index Name')})"
        assert scan["Node Type"] != "Seq Scan", where
        assert examined(scan) <= at_most, f"{where} read {examined(scan)} rows"
    sorts = [n for p in plans for n in nodes(p) if "Sort" in n["Node Type"]]
    for sort in sorts:  # sorting what was claimed is fine; sorting the backlog is not
        assert sort["Actual Rows"] <= EXAMINED_MAX, sort


def assert_reads_only_the_due(plans: list[dict[str, Any]]) -> None:
    """The due jobs and their files are found through indexes, and no scan of
    recognition_job, stored_file or s3_object reads more than twice the due rows (room
    for a plan that meets a row twice; the rows around them number tens of thousands)."""
    assert {"recognition_job", "stored_file"} <= {table_of(s) for s in table_scans(plans)}
    assert_bounded(plans, at_most=2 * DUE)


def the_scan_of(plans: list[dict[str, Any]], index: str) -> dict[str, Any]:
    found = [s for s in table_scans(plans) if s.get("Index Name") == index]
    assert len(found) == 1, f"{len(found)} scans of {index}"
    assert found[0]["Node Type"] in ("Index Scan", "Index Only Scan"), found[0]["Node Type"]
    return found[0]


def test_sweep_reads_only_the_overdue_jobs(loaded_db: str) -> None:
    rows, plans = explained(loaded_db, "SELECT arm.sweep_timeouts()")
    assert rows == [(DUE,)]
    assert_reads_only_the_due(plans)
    scan = the_scan_of(plans, "recognition_job_live_deadline_idx")
    assert "reply_deadline <" in scan["Index Cond"]
    assert scan["Actual Rows"] == DUE


def test_dead_letter_unacked_reads_only_the_overdue_jobs(loaded_db: str) -> None:
    rows, plans = explained(
        loaded_db, query("dead_letter_unacked"), {"ack_timeout": ACK_TIMEOUT, "max_republish": 0}
    )
    assert len(rows) == DUE
    assert_reads_only_the_due(plans)
    scan = the_scan_of(plans, "recognition_job_unacked_idx")
    assert "last_published_at <=" in scan["Index Cond"]
    assert scan["Actual Rows"] == DUE


@pytest.mark.parametrize("limit", [500, 5_000, 100_000])
def test_claim_unacked_reads_only_the_overdue_jobs(loaded_db: str, limit: int) -> None:
    """The bridge's default batch (500), and limits above what the planner expects to be
    due (thousands, from the history's statistics): a claim planned for that many rows
    hashed all of stored_file, and a LIMIT above the estimate read every published job."""
    rows, plans = explained(
        loaded_db,
        query("claim_unacked_jobs"),
        {"limit": limit, "ack_timeout": ACK_TIMEOUT, "max_republish": 3},
    )
    assert len(rows) == DUE
    assert_reads_only_the_due(plans)
    scan = the_scan_of(plans, "recognition_job_unacked_idx")
    assert "last_published_at <=" in scan["Index Cond"]
    assert scan["Actual Rows"] == DUE


def test_the_publishers_claim_reads_only_the_claimed_jobs(loaded_db: str) -> None:
    """The backlog shares one requested_at: only an index in the claim's full order,
    (requested_at, id), lets LIMIT stop the scan; the batch is then built and marked by
    primary key."""
    limit = 50
    rows, plans = explained(
        loaded_db,
        query("publish_queued_jobs"),
        claim_params(limit),
    )
    assert len(rows) == limit
    assert_bounded(plans)
    scan = the_scan_of(plans, "recognition_job_queued_idx")
    assert scan["Actual Rows"] == limit


def test_oldest_queued_age_reads_one_index_entry(loaded_db: str) -> None:
    rows, plans = explained(loaded_db, query("outbox_ready_age"))
    assert rows[0][0] > 0
    assert_bounded(plans)
    scan = the_scan_of(plans, "recognition_job_queued_idx")
    assert scan["Actual Rows"] == 1


def test_the_ready_age_of_a_held_back_pipeline_reads_neither_its_backlog_nor_its_flight(
    loaded_db: str,
) -> None:
    """The tabular pipeline at its limit (paced, a DBA's limit of 50 under the LIVE jobs in
    flight) holds back the whole BACKLOG: the ready age counts at most the limit's jobs in
    flight and descends the image pipeline's lanes (none), never the backlog."""
    rows, plans = explained(
        loaded_db,
        query("outbox_ready_age"),
        setup=(
            "UPDATE arm.pipeline_pace SET mode = 'fixed'",
            "UPDATE arm.pipeline_pace SET pinned_limit = 50 WHERE pipeline = 'tabular'",
        ),
    )
    assert rows == [(0.0,)]
    assert_bounded(plans)
    counted = [
        s for s in table_scans(plans) if s.get("Index Name") == "recognition_job_in_flight_idx"
    ]
    assert sorted(s["Actual Rows"] for s in counted) == [0, 50]  # image's none, tabular's limit


# The sweep, the dead-lettering and the unacked claim lock what is due in batches of
# BATCH (a LIMIT in each function); a backlog of several batches must still drain in one
# call, skipping only rows another session holds. All the jobs below share one deadline
# and one last publish, so the batches also meet ties at their boundaries.
BATCH = 1000
OVER_BATCHES = 2 * BATCH + 500


@pytest.fixture
def big_backlog(conn: Conn) -> Conn:
    """OVER_BATCHES published jobs, all past one reply deadline and one ack timeout."""
    _bulk_upload(conn, OVER_BATCHES)
    publish(conn, limit=OVER_BATCHES, tabular_timeout=0)
    conn.execute(
        "UPDATE arm.recognition_job SET reply_deadline = now() - interval '1 minute', "
        "last_published_at = now() - interval '2 hours' WHERE status = 'published'"
    )
    return conn


def _holding_one_job(db_url: str) -> tuple[psycopg.Connection[Any], uuid.UUID]:
    """Another session's transaction holding the lock of one due job: the first of the
    first batch in the claims' order."""
    other = psycopg.connect(db_url)
    row = other.execute(
        "SELECT id FROM arm.recognition_job WHERE status = 'published' "
        "ORDER BY last_published_at, id LIMIT 1 FOR UPDATE"
    ).fetchone()
    assert row is not None
    return other, row[0]


def release(other: psycopg.Connection[Any]) -> None:
    """Ends the other session's transaction and waits for the server to say so: a bare
    close() returns before the server has let go of the row lock, and a sweep right
    after may still skip the row."""
    other.rollback()
    other.close()


def _statuses(conn: Conn) -> dict[tuple[str, str | None], int]:
    """(job status, status of its file where the job is current) → how many jobs."""
    rows = conn.execute(
        "SELECT j.status::text AS job, f.status::text AS file, count(*) AS n "
        "FROM arm.recognition_job j "
        "LEFT JOIN arm.stored_file f ON f.current_recognition_job_id = j.id "
        "GROUP BY 1, 2"
    ).fetchall()
    return {(r["job"], r["file"]): r["n"] for r in rows}


def test_a_sweep_over_several_batches_times_out_every_job_it_can_lock(
    big_backlog: Conn, db_url: str
) -> None:
    other, held = _holding_one_job(db_url)
    try:
        assert big_backlog.execute("SELECT arm.sweep_timeouts() AS n").fetchone() == {
            "n": OVER_BATCHES - 1
        }
    finally:
        release(other)
    assert _statuses(big_backlog) == {
        ("timeout", "ERROR"): OVER_BATCHES - 1,
        ("published", "UPLOADED"): 1,
    }
    assert big_backlog.execute(
        "SELECT status::text FROM arm.recognition_job WHERE id = %s", (held,)
    ).fetchone() == {"status": "published"}
    assert big_backlog.execute("SELECT arm.sweep_timeouts() AS n").fetchone() == {"n": 1}


def test_dead_lettering_over_several_batches_moves_every_job_it_can_lock(
    big_backlog: Conn, db_url: str
) -> None:
    params = {"ack_timeout": ACK_TIMEOUT, "max_republish": 0}
    other, held = _holding_one_job(db_url)
    try:
        moved = big_backlog.execute(query("dead_letter_unacked"), params).fetchall()
    finally:
        release(other)
    assert len({r["job_id"] for r in moved}) == len(moved) == OVER_BATCHES - 1
    assert held not in {r["job_id"] for r in moved}
    assert _statuses(big_backlog) == {
        ("dlq", "ERROR"): OVER_BATCHES - 1,
        ("published", "UPLOADED"): 1,
    }
    assert len(big_backlog.execute(query("dead_letter_unacked"), params).fetchall()) == 1


@pytest.mark.parametrize("limit", [BATCH, OVER_BATCHES - 300, None])
def test_an_unacked_claim_over_several_batches_returns_its_limit_oldest_first(
    big_backlog: Conn, limit: int | None
) -> None:
    """Oldest first: by last publish, then id (all here went out at once). No limit
    (NULL, as SQL's LIMIT NULL) claims every overdue job."""
    params = {"limit": limit, "ack_timeout": ACK_TIMEOUT, "max_republish": 3}
    with big_backlog.transaction(force_rollback=True):
        claimed = [r["job_id"] for r in big_backlog.execute(query("claim_unacked_jobs"), params)]
        oldest = big_backlog.execute(
            "SELECT id FROM arm.recognition_job WHERE status = 'published' "
            "ORDER BY last_published_at, id LIMIT %s",
            (limit,),
        ).fetchall()
    assert claimed == [r["id"] for r in oldest]
