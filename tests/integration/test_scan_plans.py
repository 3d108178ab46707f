"""Scans bounded by what is due (issue 8): the claims, the dead-lettering and the timeout
sweep read their indexes from a bound computed once, so what they cost follows the rows
they return — not the backlog, the live jobs or the history. Checked on the real
functions, with the plans auto_explain logs from inside them (nested statements, actual
row counts), over tens of thousands of ANALYZEd jobs of which a handful are due."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from arm_core.db import query
from arm_core.embedded import EmbeddedPostgres
from tests.sqlhelpers import Conn, dict_conn, publish

pytestmark = pytest.mark.integration

LIVE = 20_000  # published jobs whose reply deadline and ack timeout are far off
BACKLOG = 20_000  # queued jobs of one upload transaction (one requested_at)
DUE = 5  # published jobs past their reply deadline and their ack timeout
ACK_TIMEOUT = 1800.0  # seconds; the due jobs went out two hours ago, the live ones now
# Rows any one scan of the job tables may touch. The due work is a handful of rows; a
# scan proportional to the live jobs or the backlog would touch thousands.
EXAMINED_MAX = 100
TABLES = {"recognition_job", "stored_file", "s3_object"}

AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET auto_explain.log_min_duration = 0",
    "SET auto_explain.log_nested_statements = on",
    "SET auto_explain.log_analyze = on",
    "SET auto_explain.log_format = json",
    "SET auto_explain.log_level = notice",
)


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


@pytest.fixture(scope="module")
def loaded_db(pg_server: EmbeddedPostgres, template_db: str) -> Iterator[str]:
    """One database for the module (building it is the slow part): DUE overdue published
    jobs, LIVE published jobs due in an hour, a BACKLOG of queued jobs. Every test runs
    its function in a transaction that is rolled back."""
    name = f"arm_plans_{uuid.uuid4().hex[:12]}"
    pg_server.create_database(name, template=template_db)
    url = pg_server.url(name)
    try:
        with dict_conn(url) as conn:
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
            conn.execute("ANALYZE arm.recognition_job, arm.stored_file, arm.s3_object")
        yield url
    finally:
        pg_server.drop_database(name)


def explained(url: str, sql: str, params: dict[str, Any] | None = None) -> tuple[list, list]:
    """Runs sql (rolled back afterwards) under auto_explain; returns its rows and the plan
    of every statement it ran, the functions' own statements included."""
    notices: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for setting in AUTO_EXPLAIN:
            conn.execute(setting)
        with conn.transaction(force_rollback=True):
            rows = conn.execute(sql, params).fetchall()
    plans = [json.loads(n.split("plan:", 1)[1])["Plan"] for n in notices if "plan:" in n]
    assert plans, "auto_explain logged nothing"
    return rows, plans


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def table_scans(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every scan node of the job tables (not the ModifyTable nodes that name them)."""
    return [
        n
        for plan in plans
        for n in nodes(plan)
        if n.get("Relation Name") in TABLES and n["Node Type"].endswith("Scan")
    ]


def examined(scan: dict[str, Any]) -> float:
    """Rows a scan node read: returned plus filtered out, over all its loops."""
    per_loop = (
        scan["Actual Rows"]
        + scan.get("Rows Removed by Filter", 0)
        + scan.get("Rows Removed by Index Recheck", 0)
    )
    return per_loop * scan["Actual Loops"]


def assert_bounded(plans: list[dict[str, Any]]) -> None:
    scans = table_scans(plans)
    assert scans
    for scan in scans:
        where = f"{scan['Node Type']} on {scan['Relation Name']} ({scan.get('Index Name')})"
        assert scan["Node Type"] != "Seq Scan", where
        assert examined(scan) <= EXAMINED_MAX, f"{where} read {examined(scan)} rows"
    sorts = [n for p in plans for n in nodes(p) if "Sort" in n["Node Type"]]
    for sort in sorts:  # sorting what was claimed is fine; sorting the backlog is not
        assert sort["Actual Rows"] <= EXAMINED_MAX, sort


def the_scan_of(plans: list[dict[str, Any]], index: str) -> dict[str, Any]:
    found = [s for s in table_scans(plans) if s.get("Index Name") == index]
    assert len(found) == 1, f"{len(found)} scans of {index}"
    assert found[0]["Node Type"] in ("Index Scan", "Index Only Scan"), found[0]["Node Type"]
    return found[0]


def test_sweep_reads_only_the_overdue_jobs(loaded_db: str) -> None:
    rows, plans = explained(loaded_db, "SELECT arm.sweep_timeouts()")
    assert rows == [(DUE,)]
    assert_bounded(plans)
    scan = the_scan_of(plans, "recognition_job_live_deadline_idx")
    assert "reply_deadline <" in scan["Index Cond"]
    assert scan["Actual Rows"] == DUE


def test_dead_letter_unacked_reads_only_the_overdue_jobs(loaded_db: str) -> None:
    rows, plans = explained(
        loaded_db, query("dead_letter_unacked"), {"ack_timeout": ACK_TIMEOUT, "max_republish": 0}
    )
    assert len(rows) == DUE
    assert_bounded(plans)
    scan = the_scan_of(plans, "recognition_job_unacked_idx")
    assert "last_published_at <=" in scan["Index Cond"]
    assert scan["Actual Rows"] == DUE


def test_claim_unacked_reads_only_the_overdue_jobs(loaded_db: str) -> None:
    rows, plans = explained(
        loaded_db,
        query("claim_unacked_jobs"),
        {"limit": 500, "ack_timeout": ACK_TIMEOUT, "max_republish": 3},
    )
    assert len(rows) == DUE
    assert_bounded(plans)
    scan = the_scan_of(plans, "recognition_job_unacked_idx")
    assert "last_published_at <=" in scan["Index Cond"]
    assert scan["Actual Rows"] == DUE


def test_claim_queued_reads_only_the_claimed_jobs(loaded_db: str) -> None:
    """The backlog shares one requested_at: only an index in the claim's full order,
    (requested_at, id), lets LIMIT stop the scan."""
    limit = 50
    rows, plans = explained(
        loaded_db,
        query("claim_queued_jobs"),
        {"limit": limit, "tabular_timeout": 600, "image_timeout": 1800},
    )
    assert len(rows) == limit
    assert_bounded(plans)
    scan = the_scan_of(plans, "recognition_job_queued_idx")
    assert scan["Actual Rows"] == limit


def test_oldest_queued_age_reads_one_index_entry(loaded_db: str) -> None:
    rows, plans = explained(loaded_db, query("outbox_oldest_queued_age"))
    assert rows[0][0] > 0
    assert_bounded(plans)
    scan = the_scan_of(plans, "recognition_job_queued_idx")
    assert scan["Actual Rows"] == 1
