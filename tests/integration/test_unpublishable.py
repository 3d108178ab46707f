"""queued → dlq for a request that cannot be published: arm.dead_letter_unpublishable,
the guard that allows it, and the publish-field invariant that makes room for it."""

from __future__ import annotations

import concurrent.futures
import json
import uuid
from typing import Any

import psycopg
import pytest

from arm_core.devtools.testbed.polling import wait_for_sync
from arm_core.devtools.testbed.sql import (
    DEAD_LETTER_UNPUBLISHABLE,
    Conn,
    ack,
    dict_conn,
    fail_by_timeout,
    job,
    publish,
    publish_open,
    result,
    retry,
    scalar,
    stored_file,
    upload,
)

pytestmark = pytest.mark.integration

PUBLISH_FIELDS = ("published_at", "request_msg_id", "request_subject", "reply_deadline")


def dead_letter(
    conn: Conn, job_ids: list[uuid.UUID], codes: list[str | None], messages: list[str | None]
) -> list[dict[str, Any]]:
    return conn.execute(
        DEAD_LETTER_UNPUBLISHABLE,
        {"job_ids": job_ids, "error_codes": codes, "error_messages": messages},
    ).fetchall()


def test_a_dead_lettered_job_is_left_out_of_the_next_publish(conn: Conn) -> None:
    """A DBA dead-letters one queued job whose request must not go out; the publisher's
    next statement publishes the others and leaves it alone."""
    big, ok1, ok2 = upload(conn), upload(conn), upload(conn)
    moved = dead_letter(
        conn, [big.job_id], ["REQUEST_TOO_LARGE"], ["request of 2 MB > max_payload 1 MB"]
    )
    assert sorted(c["job_id"] for c in publish(conn)) == sorted([ok1.job_id, ok2.job_id])
    assert moved == [{"job_id": big.job_id, "attempt": 1, "file_id": big.file_id}]
    row = job(conn, big.job_id)
    assert row["status"] == "dlq"
    assert row["error_code"] == "REQUEST_TOO_LARGE"
    assert row["error_message"] == "request of 2 MB > max_payload 1 MB"
    assert row["finished_at"] is not None
    assert row["republish_count"] == 0
    assert all(row[f] is None for f in (*PUBLISH_FIELDS, "last_published_at"))
    assert stored_file(conn, big.file_id)["status"] == "ERROR"
    for up in (ok1, ok2):
        assert job(conn, up.job_id)["status"] == "published"
        assert stored_file(conn, up.file_id)["status"] == "UPLOADED"


def test_only_queued_jobs_move(conn: Conn) -> None:
    final = upload(conn)
    fail_by_timeout(conn, final)
    published, processing = upload(conn), upload(conn)
    publish(conn)
    ack(conn, processing.job_id, processing.file_id)
    queued = upload(conn)
    others = [published, processing, final]
    before = {u.job_id: job(conn, u.job_id) for u in others}

    ids = [u.job_id for u in (*others, queued)] + [uuid.uuid4()]  # and an unknown id
    moved = dead_letter(conn, ids, ["TOO_LARGE"] * len(ids), [None] * len(ids))
    assert [m["job_id"] for m in moved] == [queued.job_id]
    assert {u.job_id: job(conn, u.job_id) for u in others} == before
    assert job(conn, queued.job_id)["error_message"] is None
    # Twice is harmless: the job is no longer queued.
    assert dead_letter(conn, [queued.job_id], ["TOO_LARGE"], [None]) == []


def test_a_job_named_twice_moves_once_with_its_first_code(conn: Conn) -> None:
    up = upload(conn)
    moved = dead_letter(conn, [up.job_id, up.job_id], ["FIRST", "SECOND"], ["1", "2"])
    assert len(moved) == 1
    assert (job(conn, up.job_id)["error_code"], job(conn, up.job_id)["error_message"]) == (
        "FIRST",
        "1",
    )


def test_the_file_is_left_alone_when_the_job_is_not_current(conn: Conn) -> None:
    up = upload(conn)
    conn.execute(
        "UPDATE arm.stored_file SET current_recognition_job_id = NULL WHERE id = %s",
        (up.file_id,),
    )
    assert len(dead_letter(conn, [up.job_id], ["TOO_LARGE"], [None])) == 1
    assert stored_file(conn, up.file_id)["status"] == "UPLOADED"


def test_retry_makes_a_new_attempt_after_an_unpublishable_dlq(conn: Conn) -> None:
    up = upload(conn)
    dead_letter(conn, [up.job_id], ["REQUEST_TOO_LARGE"], ["too large"])
    out = retry(conn, up.file_id)
    assert (out["outcome"], out["attempt"], out["previous_status"]) == ("retried", 2, "dlq")
    assert job(conn, out["job_id"])["status"] == "queued"
    assert stored_file(conn, up.file_id)["status"] == "UPLOADED"
    # The read model shows the never-published attempt as it is.
    shown = scalar(conn, "SELECT arm.get_file(%s)", (up.file_id,))
    first = shown["attempts"][0]
    assert (first["status"], first["published_at"], first["request_msg_id"]) == ("dlq", None, None)
    assert first["error"] == {"code": "REQUEST_TOO_LARGE", "message": "too large"}
    # And the new attempt goes through as usual.
    [claimed] = publish(conn)
    assert claimed["job_id"] == out["job_id"]
    assert result(conn, out["job_id"], up.file_id, attempt=2)["outcome"] == "applied"


@pytest.mark.parametrize(
    ("codes", "messages", "match"),
    [
        (["A"], [None, None], "one error code and one error message per job id"),
        ([], [], "one error code and one error message per job id"),
        ([None], [None], "needs an error code"),
        ([""], ["m"], "needs an error code"),
    ],
)
def test_malformed_calls_are_refused(
    conn: Conn, codes: list[str | None], messages: list[str | None], match: str
) -> None:
    up = upload(conn)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=match):
        dead_letter(conn, [up.job_id], codes, messages)
    assert job(conn, up.job_id)["status"] == "queued"


def test_a_publish_that_commits_first_wins(db_url: str) -> None:
    """A DBA dead-letters a job while a publisher's arm.publish_queued_jobs has not
    committed yet: the call waits for the row, then sees it published and leaves it."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
    with dict_conn(db_url) as publisher, dict_conn(db_url) as dba:
        publisher.autocommit = False
        assert [c["outcome"] for c in publish_open(publisher)] == ["published"]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(dead_letter, dba, [up.job_id], ["TOO_LARGE"], [None])

            def blocked() -> bool:
                assert not pending.done(), f"finished early: {pending.result()}"
                return _waiting_on_lock(db_url, dba.info.backend_pid)

            wait_for_sync(blocked, 10, "the dead-lettering blocked on the row", every=0.02)
            publisher.commit()
            assert pending.result(timeout=10) == []
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "published"
        assert stored_file(conn, up.file_id)["status"] == "UPLOADED"


def _waiting_on_lock(db_url: str, pid: int) -> bool:
    with psycopg.connect(db_url, autocommit=True) as c:
        found = c.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
    return found is not None and found[0] == "Lock"


# --- the guard and the publish fields ----------------------------------------------


def test_a_dba_may_move_a_queued_job_to_dlq_by_hand(conn: Conn) -> None:
    up = upload(conn)
    conn.execute(
        "UPDATE arm.recognition_job SET status = 'dlq', error_code = 'MANUAL', "
        "finished_at = now() WHERE id = %s",
        (up.job_id,),
    )
    assert job(conn, up.job_id)["status"] == "dlq"


@pytest.mark.parametrize(
    "bad_update",
    [
        # a dlq with some publish fields but not all
        "SET status = 'dlq', error_code = 'X', finished_at = now(), published_at = now()",
        # a republish counted on a job that never went out
        "SET status = 'dlq', error_code = 'X', finished_at = now(), republish_count = 1",
        # queued → timeout is still no transition
        "SET status = 'timeout', error_code = 'X', finished_at = now()",
    ],
)
def test_an_unpublished_dlq_stays_consistent(conn: Conn, bad_update: str) -> None:
    up = upload(conn)
    with pytest.raises(psycopg.errors.CheckViolation):
        conn.execute(f"UPDATE arm.recognition_job {bad_update} WHERE id = %s", (up.job_id,))
    assert job(conn, up.job_id)["status"] == "queued"


@pytest.mark.parametrize("field", [*PUBLISH_FIELDS, "last_published_at"])
def test_a_published_job_keeps_every_publish_field(conn: Conn, field: str) -> None:
    up = upload(conn)
    publish(conn)
    with pytest.raises(psycopg.errors.CheckViolation, match="recognition_job_published_fields"):
        conn.execute(f"UPDATE arm.recognition_job SET {field} = NULL WHERE id = %s", (up.job_id,))


def test_publish_queued_jobs_dead_letters_only_what_exceeds_max_bytes(db_url: str) -> None:
    """The bridge's one statement: requests that fit are marked published with their
    subject and Nats-Msg-Id, oldest first; the one over max_bytes (payload plus header
    block) goes queued → dlq REQUEST_TOO_LARGE with its file ERROR, nothing published
    about it; a rollback (the publish failed) leaves every job queued."""
    with dict_conn(db_url) as conn:
        small = upload(conn)
        big = upload(conn, name="Ж" * 900 + ".xlsx")
        scan = upload(conn, "PDF")
    with dict_conn(db_url) as publisher:
        publisher.autocommit = False
        rows = publish_open(publisher, max_bytes=1500)
        publisher.rollback()
        assert len(rows) == 3
        with dict_conn(db_url) as conn:
            assert {job(conn, u.job_id)["status"] for u in (small, big, scan)} == {"queued"}

        rows = publish_open(publisher, max_bytes=1500)
        publisher.commit()
    by_id = {r["job_id"]: r for r in rows}
    assert [r["job_id"] for r in rows] == [small.job_id, big.job_id, scan.job_id]
    assert by_id[small.job_id]["outcome"] == "published"
    assert by_id[small.job_id]["subject"] == "files.tabular_uploaded"
    assert by_id[scan.job_id]["subject"] == "files.img_uploaded"
    assert by_id[small.job_id]["msg_id"] == f"{small.job_id}:1"
    assert json.loads(by_id[small.job_id]["request"])["job_id"] == str(small.job_id)
    dead = by_id[big.job_id]
    assert dead["outcome"] == "dlq" and dead["request"] is None
    assert "max_payload" in dead["error_message"]
    with dict_conn(db_url) as conn:
        row = job(conn, big.job_id)
        assert (row["status"], row["error_code"]) == ("dlq", "REQUEST_TOO_LARGE")
        assert row["published_at"] is None and row["reply_deadline"] is None
        assert stored_file(conn, big.file_id)["status"] == "ERROR"
        assert job(conn, small.job_id)["status"] == "published"
        assert job(conn, small.job_id)["request_msg_id"] == f"{small.job_id}:1"


def test_max_bytes_counts_exactly_what_nats_py_sends(db_url: str) -> None:
    """The request plus the header block nats-py builds for the Nats-Msg-Id
    (arm.nats_message_bytes, the one rule the publisher's statement and its republish
    query share): a request of exactly max_bytes goes out, one byte over is dead-lettered."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
    with dict_conn(db_url) as publisher:
        publisher.autocommit = False
        [row] = publish_open(publisher)
        publisher.rollback()
        header = f"NATS/1.0\r\nNats-Msg-Id: {row['msg_id']}\r\n\r\n"
        size = len(row["request"].encode()) + len(header.encode())
        assert (
            scalar(
                publisher, "SELECT arm.nats_message_bytes(%s, %s)", (row["request"], row["msg_id"])
            )
            == size
        )
        publisher.rollback()

        [over] = publish_open(publisher, max_bytes=size - 1)
        publisher.rollback()
        assert (over["outcome"], over["request"]) == ("dlq", None)
        assert f"the request is {size} bytes" in over["error_message"]
        [fits] = publish_open(publisher, max_bytes=size)
        publisher.commit()
    assert (fits["job_id"], fits["outcome"]) == (up.job_id, "published")
