"""The nemesis's checker (src/arm_core/devtools/testbed/nemesis.py check) finds each
broken promise in a history made by hand: a check that cannot fail would pass any run."""

from __future__ import annotations

import pytest

from arm_core.devtools.testbed import nemesis
from arm_core.devtools.testbed.sql import dict_conn, fail_by_no_ack, publish, result, retry, upload

pytestmark = pytest.mark.integration


def history(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        conn.execute(nemesis.HISTORY)


def test_a_clean_history_has_no_problem(db_url: str) -> None:
    history(db_url)
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        result(conn, up.job_id, up.file_id, "done")
    assert nemesis.check(db_url, [], []) == []


def test_each_broken_promise_is_found(db_url: str) -> None:
    history(db_url)
    with dict_conn(db_url) as conn:
        lost = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)  # a first attempt that ended dlq: lost
        changed, twice, gap, unaudited = (upload(conn) for _ in range(4))
        publish(conn)
        for up in (changed, twice):
            result(conn, up.job_id, up.file_id, "done")
        for up in (gap, unaudited):
            result(conn, up.job_id, up.file_id, "error", error=("INVALID_DOCUMENT", "x"))
        # A final job changed again, and one made final by a second transaction, as the
        # history would show them.
        for job_id, old, new in (
            (changed.job_id, "done", "error"),
            (twice.job_id, "processing", "done"),
        ):
            conn.execute(
                "INSERT INTO nemesis.job_change (job_id, xid, old_status, new_status) "
                "VALUES (%s, '1', %s, %s)",
                (job_id, old, new),
            )
        # An attempt 3 with no attempt 2, and an attempt 2 no audited retry made.
        gap_job = retry(conn, gap.file_id)["job_id"]
        retry(conn, unaudited.file_id)
        conn.execute("ALTER TABLE arm.recognition_job DISABLE TRIGGER USER")
        conn.execute("UPDATE arm.recognition_job SET attempt = 3 WHERE id = %s", (gap_job,))
        conn.execute("ALTER TABLE arm.recognition_job ENABLE TRIGGER USER")
        conn.execute("DELETE FROM arm.retry_audit WHERE file_id = %s", (unaudited.file_id,))
    clicks: list[nemesis.Click] = [(str(lost.file_id), str(lost.job_id), [201, 201])]
    problems = nemesis.check(db_url, clicks, [])
    said = "\n".join(problems)
    assert f"job {lost.job_id}: a first attempt ended dlq (lost)" in said
    assert f"file {lost.file_id}: its current attempt 1 is dlq, not done" in said
    assert f"job {changed.job_id}: changed after it was final (done → error" in said
    assert f"job {twice.job_id}: made final by 2 transactions" in said
    assert f"file {gap.file_id}: attempts [1, 3] are not contiguous from 1" in said
    assert "made by 0 audited retries, not 1" in said
    assert f"file {lost.file_id}: a double click on job {lost.job_id} made two attempts" in said
    # The click's answers said a retry was made, yet the job it named is still current.
    assert (
        f"file {lost.file_id}: a retry of job {lost.job_id} answered 201, yet it is still current"
        in said
    )
    assert "(retries of it answered [[201, 201]])" in said
    assert f"file {unaudited.file_id}: its current attempt 2 is queued, not done" in said
    assert "(retries of it answered nothing: never clicked)" in said
