"""Retiring old history (arm.archive_files, db/functions/90_archive.sql): finished files
older than a period move, with every attempt and retry of them, out of the hot tables;
nothing live and nothing recent moves; a file and its current job are never apart; a
retry of an archived file is refused with its reason; the file view reads the archive."""

from __future__ import annotations

import re
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from arm_core.devtools.testbed.polling import wait_for_sync
from arm_core.devtools.testbed.sql import (
    OWNER_LOGIN,
    Conn,
    age,
    archive,
    as_login,
    dict_conn,
    fail_by_no_ack,
    publish,
    result,
    retry,
    scalar,
    upload,
)

pytestmark = pytest.mark.integration

ERROR = ("UNSUPPORTED_FORMAT", "not a balance sheet")
DBAS = Path(__file__).resolve().parents[2] / "docs" / "dbas.md"


def where(conn: Conn, file_id: uuid.UUID) -> tuple[int, int, int, int]:
    """(hot files, hot jobs, archived files, archived jobs) of one file."""
    return (
        scalar(conn, "SELECT count(*) FROM arm.stored_file WHERE id = %s", (file_id,)),
        scalar(conn, "SELECT count(*) FROM arm.recognition_job WHERE file_id = %s", (file_id,)),
        scalar(conn, "SELECT count(*) FROM arm.archived_file WHERE id = %s", (file_id,)),
        scalar(conn, "SELECT count(*) FROM arm.archived_job WHERE file_id = %s", (file_id,)),
    )


def test_old_finished_files_move_with_every_attempt_and_retry(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        old_done, retried, recent, live = (upload(conn) for _ in range(4))
        publish(conn)
        result(conn, old_done.job_id, old_done.file_id, "done")
        result(conn, recent.job_id, recent.file_id, "done")
        result(conn, retried.job_id, retried.file_id, "error", error=ERROR)
        second = retry(conn, retried.file_id)
        publish(conn)
        result(conn, second["job_id"], retried.file_id, "done", attempt=2)
        for up in (old_done, retried, live):
            age(conn, up.file_id, 60)
        before = scalar(conn, "SELECT n FROM arm.job_counts() WHERE status = 'done'")

        moved = archive(conn)
        assert (moved["files"], moved["jobs"], moved["retries"]) == (2, 3, 1)
        assert where(conn, old_done.file_id) == (0, 0, 1, 1)
        assert where(conn, retried.file_id) == (0, 0, 1, 2)
        assert where(conn, recent.file_id) == (1, 1, 0, 0)  # finished within the period
        assert where(conn, live.file_id) == (1, 1, 0, 0)  # old, but its job is live
        assert (
            scalar(
                conn,
                "SELECT count(*) FROM arm.archived_retry_audit WHERE file_id = %s",
                (retried.file_id,),
            )
            == 1
        )
        # The counts describe the hot tables.
        assert scalar(conn, "SELECT n FROM arm.job_counts() WHERE status = 'done'") == before - 2
        # Nothing more to move: the next batch moves nothing.
        again = archive(conn)
        assert (again["files"], again["jobs"], again["retries"]) == (0, 0, 0)


def test_batches_take_the_oldest_first_and_stop_at_the_limit(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(5)]
        publish(conn)
        for n, up in enumerate(ups):
            result(conn, up.job_id, up.file_id, "done")
            age(conn, up.file_id, 40 + n)
        first = archive(conn, limit=2)
        assert first["files"] == 2
        assert {where(conn, up.file_id)[2] for up in ups[3:]} == {1}  # the two oldest
        rest = archive(conn, limit=10)
        assert rest["files"] == 3
        assert scalar(conn, "SELECT count(*) FROM arm.stored_file") == 0


def test_a_day_of_history_always_stays_and_a_batch_moves_something(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        for since, limit, said in (
            ("now() - interval '1 hour'", 10, "keeps at least the last day"),
            ("NULL", 10, "keeps at least the last day"),
            ("now() - interval '2 days'", 0, "at least one file a batch"),
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=said):
                with conn.transaction():
                    conn.execute(f"SELECT * FROM arm.archive_files({since}, {limit})")


def test_a_retry_of_an_archived_file_is_refused_with_its_reason(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        result(conn, up.job_id, up.file_id, "error", error=ERROR)
        age(conn, up.file_id, 60)
        assert archive(conn)["files"] == 1
        refused = retry(conn, up.file_id, expected_job_id=up.job_id)
        assert (refused["outcome"], refused["reason"]) == ("not_retryable", "archived")
        assert (refused["previous_job_id"], refused["previous_status"]) == (up.job_id, "error")
        assert refused["job_id"] is None
        assert where(conn, up.file_id) == (0, 0, 1, 1)  # nothing was made
        missing = retry(conn, uuid.uuid4())
        assert (missing["outcome"], missing["reason"]) == ("not_found", "file_not_found")


def test_a_retry_that_holds_the_file_keeps_it_hot_and_one_waiting_is_refused(
    db_url: str,
) -> None:
    """The archive skips a file another transaction holds (FOR UPDATE SKIP LOCKED); a
    retry that waited for the archive's lock finds the file gone and is refused."""
    with dict_conn(db_url) as conn:
        held, waited = upload(conn), upload(conn)
        publish(conn)
        for up in (held, waited):
            result(conn, up.job_id, up.file_id, "error", error=ERROR)
            age(conn, up.file_id, 60)
    with dict_conn(db_url) as holder, dict_conn(db_url) as archiver:
        with holder.transaction():
            holder.execute(
                "SELECT 1 FROM arm.stored_file WHERE id = %s FOR UPDATE", (held.file_id,)
            )
            moved = archive(archiver)
            assert moved["files"] == 1  # only the file nobody held
        assert where(archiver, held.file_id) == (1, 1, 0, 0)
        # Now the other way round: the archive holds the file while a retry waits.
        archiver.autocommit = False
        try:
            archive(archiver)  # held's file, in an open transaction
            answer: dict[str, Any] = {}

            def retry_it() -> None:
                with dict_conn(db_url) as conn:
                    answer.update(retry(conn, held.file_id, expected_job_id=held.job_id))

            thread = threading.Thread(target=retry_it)
            thread.start()
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            wait_for_sync(lambda: scalar(holder, waiting) >= 1, 10, "the retry waited for the file")
            archiver.commit()
            thread.join(10)
            assert not thread.is_alive()
        finally:
            archiver.autocommit = True
        assert (answer["outcome"], answer["reason"]) == ("not_retryable", "archived")
        assert where(archiver, held.file_id) == (0, 0, 1, 1)


def test_the_file_view_reads_an_archived_file_as_archived(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        result(conn, up.job_id, up.file_id, "error", error=ERROR)
        second = retry(conn, up.file_id, actor="ivanova")
        publish(conn)
        result(conn, second["job_id"], up.file_id, "done", attempt=2)
        hot = scalar(conn, "SELECT arm.get_file(%s)", (up.file_id,))
        age(conn, up.file_id, 60)
        assert hot["file"]["archived_at"] is None
        assert archive(conn)["files"] == 1
        cold = scalar(conn, "SELECT arm.get_file(%s)", (up.file_id,))
    assert cold["file"]["archived_at"] is not None
    assert cold["file"]["id"] == str(up.file_id)
    assert cold["current_job"]["job_id"] == str(second["job_id"])
    assert [a["attempt"] for a in cold["attempts"]] == [1, 2]
    assert [a["status"] for a in cold["attempts"]] == ["error", "done"]
    assert [(r["actor"], r["new_attempt"]) for r in cold["retries"]] == [("ivanova", 2)]
    # The same document as before, but for its archive stamp and the times moved back.
    assert cold["attempts"][1]["result"] == hot["attempts"][1]["result"]
    assert cold["file"]["s3"] == hot["file"]["s3"]


def test_the_archive_keeps_the_level_each_retry_was_made_with(db_url: str) -> None:
    """The API's retry records its level, a DBA's records none; both move as they were,
    and the file view shows them from the archive."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        result(conn, up.job_id, up.file_id, "error", error=ERROR)
        second = retry(conn, up.file_id, actor="ivanova", actor_level="operator")
        publish(conn)
        result(conn, second["job_id"], up.file_id, "error", error=ERROR, attempt=2)
        [third] = conn.execute("SELECT * FROM arm.retry_file(%s, 'dba')", (up.file_id,))
        publish(conn)
        result(conn, third["job_id"], up.file_id, "done", attempt=3)
        audit = "SELECT actor, actor_level, new_attempt FROM arm.{} WHERE file_id = %s ORDER BY id"
        hot = conn.execute(audit.format("retry_audit"), (up.file_id,)).fetchall()
        assert [(r["actor"], r["actor_level"]) for r in hot] == [
            ("ivanova", "operator"),
            ("dba", None),
        ]
        age(conn, up.file_id, 60)
        assert archive(conn)["retries"] == 2
        assert conn.execute(audit.format("archived_retry_audit"), (up.file_id,)).fetchall() == hot
        cold = scalar(conn, "SELECT arm.get_file(%s)", (up.file_id,))
    assert cold["file"]["archived_at"] is not None
    assert [(r["actor"], r["actor_level"], r["new_attempt"]) for r in cold["retries"]] == [
        ("ivanova", "operator", 2),
        ("dba", None, 3),
    ]


def documented_purge() -> str:
    """docs/dbas.md's SQL that deletes archived files for good, with their objects."""
    section = DBAS.read_text(encoding="utf-8").split("## Retiring old history", 1)[1]
    [block] = [
        b for b in re.findall(r"```sql\n(.*?)```", section, flags=re.S) if "arm.s3_object" in b
    ]
    return block


def objects_of(conn: Conn, file_id: uuid.UUID) -> int:
    """The arm.s3_object rows a file's source and its jobs' results name, hot or archived."""
    return scalar(
        conn,
        "SELECT count(*) FROM arm.s3_object o WHERE o.id IN ("
        " SELECT s3_object_id FROM arm.stored_file WHERE id = %s"
        " UNION SELECT s3_object_id FROM arm.archived_file WHERE id = %s"
        " UNION SELECT result_s3_object_id FROM arm.recognition_job WHERE file_id = %s"
        " UNION SELECT result_s3_object_id FROM arm.archived_job WHERE file_id = %s)",
        (file_id,) * 4,
    )


def test_the_documented_purge_deletes_old_archived_files_and_their_objects(
    db_url: str,
) -> None:
    """docs/dbas.md's block, as arm_owner: files archived before the retention go with
    their jobs, retries and s3_object rows; files archived since, and hot ones, keep
    theirs; run again, it deletes nothing."""
    with dict_conn(db_url) as conn:
        expired, kept, hot = (upload(conn) for _ in range(3))
        publish(conn)
        result(conn, expired.job_id, expired.file_id, "error", error=ERROR)
        second = retry(conn, expired.file_id)
        publish(conn)
        result(conn, second["job_id"], expired.file_id, "done", attempt=2)
        result(conn, kept.job_id, kept.file_id, "done")
        result(conn, hot.job_id, hot.file_id, "done")
        sources = [up.file_id for up in (expired, kept, hot)]
        assert [objects_of(conn, f) for f in sources] == [2, 2, 2]  # a source, a result
        for up in (expired, kept):
            age(conn, up.file_id, 60)
        assert archive(conn)["files"] == 2
        conn.execute(
            "UPDATE arm.archived_file SET archived_at = now() - interval '8 years' WHERE id = %s",
            (expired.file_id,),
        )
        objects_before = scalar(conn, "SELECT count(*) FROM arm.s3_object")

        with psycopg.connect(as_login(db_url, OWNER_LOGIN), autocommit=True) as dba:
            [said] = dba.execute(documented_purge()).fetchall()
            [again] = dba.execute(documented_purge()).fetchall()

        assert said == (1, 2, 1, 2)  # files, jobs, retries, objects
        assert again == (0, 0, 0, 0)
        assert where(conn, expired.file_id) == (0, 0, 0, 0)
        assert where(conn, kept.file_id) == (0, 0, 1, 1)
        assert where(conn, hot.file_id) == (1, 1, 0, 0)
        assert scalar(conn, "SELECT count(*) FROM arm.s3_object") == objects_before - 2
        assert [objects_of(conn, f) for f in (kept.file_id, hot.file_id)] == [2, 2]
        archived = scalar(conn, "SELECT arm.get_file(%s)", (kept.file_id,))
        assert archived["attempts"][0]["result"] is not None


def test_a_late_answer_for_an_archived_job_changes_nothing(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        fail_by_no_ack(conn)
        age(conn, up.file_id, 60)
        assert archive(conn)["files"] == 1
        late = result(conn, up.job_id, up.file_id, "done")
        assert late["outcome"] == "unknown_job"
        assert where(conn, up.file_id) == (0, 0, 1, 1)


@pytest.mark.parametrize(
    ("hot", "archived", "extra"),
    [
        ("stored_file", "archived_file", ["archived_at"]),
        ("recognition_job", "archived_job", []),
        ("retry_audit", "archived_retry_audit", []),
    ],
)
def test_each_archive_table_has_its_hot_tables_columns(
    db_url: str, hot: str, archived: str, extra: list[str]
) -> None:
    """A column added to a hot table needs the same column in its archive table (the
    archive copies rows by position): this fails until a migration adds both."""
    columns = (
        "SELECT array_agg(attname || ' ' || format_type(atttypid, atttypmod) ORDER BY attnum) "
        "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped"
        " AND attgenerated = ''"
    )
    with dict_conn(db_url) as conn:
        hot_columns = scalar(conn, columns, (f"arm.{hot}",))
        archived_columns = scalar(conn, columns, (f"arm.{archived}",))
    kept = [c for c in archived_columns if c.split()[0] not in extra]
    assert kept == hot_columns
