"""docs/troubleshooting.md's re-drive after an outage, run as the page prints it: one SQL
call retries every failed file of one pipeline in the window, audited under the name
given, and reports the files it may not retry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arm_core.devtools.testbed.sql import Conn, fail_by_no_ack, publish, result, upload

pytestmark = pytest.mark.integration

PAGE = Path(__file__).resolve().parents[2] / "docs" / "troubleshooting.md"
ACTOR = "ivanova: after the parser outage"


def documented_sql() -> str:
    """The SQL block right after the page's `tested:` marker naming this file."""
    text = PAGE.read_text(encoding="utf-8")
    marker = text.index("<!-- tested: tests/integration/test_troubleshooting.py")
    [block] = re.findall(r"```sql\n(.*?)```", text[marker:], re.S)[:1]
    return block


def test_the_documented_re_drive_retries_the_pipeline_s_failed_files_in_the_window(
    conn: Conn,
) -> None:
    conn.execute("SELECT arm.set_setting('default_max_attempts', '1')")
    last_chance = upload(conn, "XLSX")  # attempt 1 of 1: may not be retried
    conn.execute("SELECT arm.set_setting('default_max_attempts', '3')")
    failed = [upload(conn, "XLSX") for _ in range(3)]
    scan = upload(conn, "PDF")  # the other pipeline
    old = upload(conn, "XLSX")  # failed before the window
    fine = upload(conn, "XLSX")
    publish(conn)
    result(conn, fine.job_id, fine.file_id, "done")
    fail_by_no_ack(conn)
    with conn.transaction():  # three hours ago (past the guard: a DBA's repair, not a rule)
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "UPDATE arm.recognition_job SET finished_at = now() - interval '3 hours' WHERE id = %s",
            (old.job_id,),
        )

    said = conn.execute(documented_sql()).fetchall()

    assert [(r["outcome"], r["reason"], r["count"]) for r in said] == [
        ("not_retryable", "attempts_exhausted", 1),
        ("retried", None, 3),
    ]
    audit = conn.execute(
        "SELECT file_id FROM arm.retry_audit WHERE actor = %s", (ACTOR,)
    ).fetchall()
    assert sorted(r["file_id"] for r in audit) == sorted(f.file_id for f in failed)
    current = {
        r["file_id"]: (r["status"], r["attempt"])
        for r in conn.execute(
            "SELECT f.id AS file_id, j.status::text AS status, j.attempt FROM arm.stored_file f "
            "JOIN arm.recognition_job j ON j.id = f.current_recognition_job_id"
        ).fetchall()
    }
    assert all(current[f.file_id] == ("queued", 2) for f in failed)
    assert current[last_chance.file_id] == ("dlq", 1)
    assert current[scan.file_id] == ("dlq", 1)
    assert current[old.file_id] == ("dlq", 1)
    assert current[fine.file_id] == ("done", 1)
