"""Every job transition through the SQL functions, as the bridge and a DBA call them
(docs/behaviour.md#outbox to #timeouts): publish, republish and dead-letter, ack, result,
sweep."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from datetime import datetime

import psycopg
import pytest

from arm_core.bridge.contracts import REQUEST_SCHEMA, validator
from arm_core.db import query
from arm_core.devtools.testbed.sql import (
    Conn,
    ack,
    dict_conn,
    job,
    one_row,
    publish,
    result,
    scalar,
    stored_file,
    upload,
)

pytestmark = pytest.mark.integration


def validate_request(body: dict) -> None:
    validator(REQUEST_SCHEMA).validate(body)


# --- outbox: publish (R-OUT-1) ------------------------------------------------------


def test_S_OUT_1_claim_builds_a_valid_request_and_marks_published(
    conn: Conn,
) -> None:
    """S-OUT-1 (SQL level): the request passes the schema and the row is published."""
    up = upload(conn, "XLSX")
    [claimed] = publish(conn, tabular_timeout=600)
    body = claimed["request"]
    validate_request(body)
    assert body["job_id"] == str(up.job_id)
    assert body["file_id"] == str(up.file_id)
    assert body["s3"] == {"bucket": "arm-ka", "key": up.key}
    assert body["attempt"] == 1
    assert body["pipeline"] == "tabular"
    assert claimed["msg_id"] == f"{up.job_id}:1"

    row = job(conn, up.job_id)
    assert row["status"] == "published"
    assert row["request_msg_id"] == f"{up.job_id}:1"
    assert row["request_subject"] == "files.tabular_uploaded"
    assert row["reply_deadline"] == datetime.fromisoformat(body["reply_deadline"])
    assert body["reply_deadline"].endswith("Z")
    deadline_left = (row["reply_deadline"] - row["published_at"]).total_seconds()
    assert 590 < deadline_left <= 600


@pytest.mark.parametrize(
    ("file_type", "name"),
    [
        ("XLSX", "ОСВ 2024.xlsx"),
        ("PNG", 'скан "кв. 1" \\ back\\slash\ttab\nnewline\x01\x1f ctl 😀 €.png'),
        ("PDF", "'single' </script> &amp; \u2028 line sep.pdf"),
    ],
)
def test_the_request_text_is_byte_for_byte_the_request_bodys_jsonb_text(
    conn: Conn, file_type: str, name: str
) -> None:
    """The claim prints the request by concatenation (arm._request_text), the republish
    prints _request_body's jsonb: the same bytes, or a republish would differ from the
    publish (its key, bucket and name carry every escape JSON has)."""
    up = upload(conn, file_type, name=name, bucket='b"q')
    text, body = one_row(
        conn,
        """
        SELECT arm._request_text(j.id, f.id, j.pipeline, f.file_type, f.original_name,
                                 o.bucket, o.key, d.t, 7) AS text,
               arm._request_body(j, f, o, d.t)::text AS body
        FROM arm.recognition_job j
        JOIN arm.stored_file f ON f.id = j.file_id
        JOIN arm.s3_object o ON o.id = f.s3_object_id
        CROSS JOIN (SELECT timestamptz '2026-12-01 10:11:12.345678+03' AS t) d
        WHERE j.id = %s
        """,
        (up.job_id,),
    ).values()
    assert text == body.replace('"attempt": 1', '"attempt": 7')
    request = json.loads(text)
    assert request["original_name"] == name and request["attempt"] == 7
    assert request["s3"]["bucket"] == 'b"q'
    assert request["reply_deadline"] == "2026-12-01T07:11:12.345Z"


def test_image_jobs_get_the_image_reply_timeout(conn: Conn) -> None:
    up = upload(conn, "PNG")
    [claimed] = publish(conn, tabular_timeout=600, image_timeout=1800)
    validate_request(claimed["request"])
    row = job(conn, up.job_id)
    assert row["request_subject"] == "files.img_uploaded"
    assert 1790 < (row["reply_deadline"] - row["published_at"]).total_seconds() <= 1800


def test_a_rolled_back_publish_leaves_the_batch_queued(conn: Conn) -> None:
    """S-OUT-2 (SQL level), on the bridge's path: the publisher's one statement claims a
    batch and marks it — published, or dlq for a request over max_bytes — and the bridge
    commits only once NATS confirmed every message. When it cannot, the transaction rolls
    back and every job is queued again as it was: none published, none dead-lettered, no
    file changed, no count moved; the next batch claims them all with the same ids."""
    ups = [upload(conn) for _ in range(3)]
    big = upload(conn, name="Ж" * 965 + ".xlsx")  # about 4 KB of request
    params = {
        "limit": 10,
        "tabular_timeout": 600,
        "image_timeout": 1800,
        "tabular_subject": "files.tabular_uploaded",
        "image_subject": "files.img_uploaded",
        "max_bytes": 2000,
    }

    def state() -> tuple[list[dict], list[dict], list[dict]]:
        return (
            conn.execute("SELECT * FROM arm.recognition_job ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM arm.stored_file ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM arm.job_counts() ORDER BY status").fetchall(),
        )

    before = state()
    with pytest.raises(RuntimeError), conn.transaction():
        claimed = conn.execute(query("publish_queued_jobs"), params).fetchall()
        assert sorted((c["job_id"], c["outcome"]) for c in claimed) == sorted(
            [(u.job_id, "published") for u in ups] + [(big.job_id, "dlq")]
        )
        assert job(conn, ups[0].job_id)["status"] == "published"  # inside the transaction
        assert job(conn, big.job_id)["status"] == "dlq"
        raise RuntimeError("NATS did not confirm the batch")
    assert state() == before
    assert {job(conn, u.job_id)["status"] for u in (*ups, big)} == {"queued"}
    with conn.transaction():
        again = conn.execute(query("publish_queued_jobs"), params).fetchall()
    assert sorted((c["job_id"], c["outcome"], c["msg_id"]) for c in again) == sorted(
        [(u.job_id, "published", f"{u.job_id}:1") for u in ups]
        + [(big.job_id, "dlq", f"{big.job_id}:1")]
    )


def test_concurrent_publishers_claim_disjoint_batches(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(40)]
    barrier = threading.Barrier(4)

    def publisher() -> list[str]:
        with dict_conn(db_url) as c:
            barrier.wait()
            got: list[str] = []
            while batch := publish(c, limit=3):
                got += [str(b["job_id"]) for b in batch]
            return got

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        batches = list(pool.map(lambda _: publisher(), range(4)))
    claimed = [j for b in batches for j in b]
    assert sorted(claimed) == sorted(str(u.job_id) for u in ups)  # each exactly once


def test_publish_claims_in_batches_oldest_first(conn: Conn) -> None:
    ups = [upload(conn) for _ in range(5)]
    first = publish(conn, limit=2)
    assert [c["job_id"] for c in first] == [ups[0].job_id, ups[1].job_id]
    assert len(publish(conn, limit=10)) == 3


# --- ack timeout: republish, then dlq (R-ACK-2) ------------------------------------


def _unacked(conn: Conn, ack_timeout: float, max_republish: int) -> list[dict]:
    with conn.transaction():
        claimed = conn.execute(
            query("claim_unacked_jobs"),
            {"limit": 100, "ack_timeout": ack_timeout, "max_republish": max_republish},
        ).fetchall()
        conn.execute(query("mark_republished"), {"job_ids": [c["job_id"] for c in claimed]})
    return claimed


def test_S_ACK_2_republish_same_id_then_dlq_no_ack(conn: Conn) -> None:
    """S-ACK-2 (SQL level): republished with the same Nats-Msg-Id and body, at most
    OUTBOX_MAX_REPUBLISH times; then dlq/NO_ACK, request_msg_id unchanged, file ERROR."""
    up = upload(conn)
    [first] = publish(conn)
    assert _unacked(conn, ack_timeout=3600, max_republish=3) == []  # not overdue yet

    for n in range(1, 4):
        [again] = _unacked(conn, ack_timeout=0, max_republish=3)
        assert again["msg_id"] == first["msg_id"] == f"{up.job_id}:1"
        assert again["request"] == first["request"]  # same attempt, same deadline
        assert again["subject"] == "files.tabular_uploaded"
        assert job(conn, up.job_id)["republish_count"] == n
        dead = conn.execute(
            query("dead_letter_unacked"), {"ack_timeout": 0, "max_republish": 3}
        ).fetchall()
        assert dead == [] or n == 3

    assert _unacked(conn, ack_timeout=0, max_republish=3) == []
    row = job(conn, up.job_id)
    assert row["status"] == "dlq"
    assert row["error_code"] == "NO_ACK"
    assert row["request_msg_id"] == f"{up.job_id}:1"
    assert row["finished_at"] is not None
    assert stored_file(conn, up.file_id)["status"] == "ERROR"


def test_dead_letter_waits_for_the_ack_timeout(conn: Conn) -> None:
    up = upload(conn)
    publish(conn)
    dead = conn.execute(
        query("dead_letter_unacked"), {"ack_timeout": 3600, "max_republish": 0}
    ).fetchall()
    assert dead == []
    assert job(conn, up.job_id)["status"] == "published"


# --- ack (R-ACK-1) -----------------------------------------------------------------


def test_S_ACK_1_ack_moves_published_to_processing(conn: Conn) -> None:
    """S-ACK-1: job processing, started_at, service_name = tabular-parser, file PROCESSING."""
    up = upload(conn)
    publish(conn)
    out = ack(conn, up.job_id, up.file_id, "tabular-parser", "2.1.0")
    assert out == {"outcome": "applied", "attempt": 1, "status": "processing"}
    row = job(conn, up.job_id)
    assert row["status"] == "processing"
    assert row["started_at"] is not None
    assert row["service_name"] == "tabular-parser"
    assert row["service_version"] == "2.1.0"
    assert stored_file(conn, up.file_id)["status"] == "PROCESSING"


def test_repeated_ack_is_ignored(conn: Conn) -> None:
    up = upload(conn)
    publish(conn)
    ack(conn, up.job_id, up.file_id)
    before = job(conn, up.job_id)
    assert ack(conn, up.job_id, up.file_id, version="9.9")["outcome"] == "duplicate"
    assert job(conn, up.job_id) == before


def test_ack_for_other_statuses_changes_nothing(conn: Conn) -> None:
    queued = upload(conn)
    assert ack(conn, queued.job_id, queued.file_id)["outcome"] == "not_published"
    assert job(conn, queued.job_id)["status"] == "queued"

    assert ack(conn, queued.job_id, queued.job_id)["outcome"] == "file_mismatch"
    unknown = ack(conn, queued.file_id, queued.file_id)
    assert unknown == {"outcome": "unknown_job", "attempt": None, "status": None}

    publish(conn, tabular_timeout=0)
    conn.execute("SELECT arm.sweep_timeouts()")
    before = job(conn, queued.job_id)
    assert ack(conn, queued.job_id, queued.file_id)["outcome"] == "already_final"
    assert job(conn, queued.job_id) == before
    assert stored_file(conn, queued.file_id)["status"] == "ERROR"


# --- results (R-IN-1) --------------------------------------------------------------


def test_S_IN_1_done_registers_the_result_object(conn: Conn) -> None:
    """S-IN-1: done with result_s3 and Nats-Msg-Id result:<job_id>:1."""
    up = upload(conn)
    publish(conn)
    ack(conn, up.job_id, up.file_id)
    key = f"results/{up.file_id}/{up.job_id}/result.json"
    out = result(
        conn, up.job_id, up.file_id, "done", result_s3=("arm-ka", key), metrics={"rows": 412}
    )
    assert out == {"outcome": "applied", "attempt": 1, "status": "done"}
    row = job(conn, up.job_id)
    assert row["status"] == "done"
    assert row["result_msg_id"] == f"result:{up.job_id}:1"
    assert row["finished_at"] is not None
    assert row["metrics"] == {"rows": 412}
    assert row["result_schema_version"] == "1.0"
    obj = conn.execute(
        "SELECT * FROM arm.s3_object WHERE id = %s", (row["result_s3_object_id"],)
    ).fetchone()
    assert obj is not None
    assert (obj["bucket"], obj["key"], obj["bucket_role"]) == ("arm-ka", key, "results")
    assert obj["created_by"] == "tabular-parser"
    assert stored_file(conn, up.file_id)["status"] == "PROCESSING"


def test_S_IN_2_the_same_result_again_changes_nothing(conn: Conn) -> None:
    """S-IN-2: recognition_job and s3_object unchanged on redelivery."""
    up = upload(conn)
    publish(conn)
    ack(conn, up.job_id, up.file_id)
    result(conn, up.job_id, up.file_id, "done")
    job_before = job(conn, up.job_id)
    objects_before = conn.execute("SELECT * FROM arm.s3_object ORDER BY id").fetchall()
    assert result(conn, up.job_id, up.file_id, "done")["outcome"] == "duplicate"
    assert job(conn, up.job_id) == job_before
    assert conn.execute("SELECT * FROM arm.s3_object ORDER BY id").fetchall() == objects_before


def test_S_IN_3_error_without_result_s3(conn: Conn) -> None:
    """S-IN-3: job error with code and message, no result object, file ERROR."""
    up = upload(conn)
    publish(conn)
    ack(conn, up.job_id, up.file_id)
    out = result(
        conn, up.job_id, up.file_id, "error", error=("UNSUPPORTED_FORMAT", "XLSB 2003 не читается")
    )
    assert out["outcome"] == "applied"
    row = job(conn, up.job_id)
    assert row["status"] == "error"
    assert row["error_code"] == "UNSUPPORTED_FORMAT"
    assert row["error_message"] == "XLSB 2003 не читается"
    assert row["result_s3_object_id"] is None
    assert stored_file(conn, up.file_id)["status"] == "ERROR"
    assert scalar(conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'") == 0


def test_S_IN_4_done_after_timeout_is_not_applied(conn: Conn) -> None:
    """S-IN-4: job already timeout, a done arrives → unchanged (the caller logs it)."""
    up = upload(conn)
    publish(conn, tabular_timeout=0)
    ack(conn, up.job_id, up.file_id)
    assert scalar(conn, "SELECT arm.sweep_timeouts()") == 1
    before = job(conn, up.job_id)
    out = result(conn, up.job_id, up.file_id, "done")
    assert out == {"outcome": "already_final", "attempt": 1, "status": "timeout"}
    assert job(conn, up.job_id) == before
    assert scalar(conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'") == 0


def test_result_whose_ack_was_lost_is_applied(conn: Conn) -> None:
    up = upload(conn)
    publish(conn)
    assert result(conn, up.job_id, up.file_id, "needs_check")["outcome"] == "applied"
    row = job(conn, up.job_id)
    assert row["status"] == "needs_check"
    assert row["started_at"] is None
    assert stored_file(conn, up.file_id)["status"] == "PROCESSING"


def test_result_for_unknown_job_or_wrong_file_is_not_applied(conn: Conn) -> None:
    up = upload(conn)
    publish(conn)
    assert result(conn, up.file_id, up.file_id)["outcome"] == "unknown_job"
    assert result(conn, up.job_id, up.job_id)["outcome"] == "file_mismatch"
    assert result(conn, up.job_id, up.file_id, "done")["outcome"] == "applied"
    # A second, different result for a final job: already_final, not applied.
    out = result(conn, up.job_id, up.file_id, "error", msg_id="x", error=("UNREADABLE", "?"))
    assert out["outcome"] == "already_final"
    assert job(conn, up.job_id)["status"] == "done"


# --- timeout sweep (R-TO-1) --------------------------------------------------------


def test_S_TO_1_sweep_counts_and_moves_files(conn: Conn) -> None:
    """S-TO-1: timeout, error_code TIMEOUT, finished_at, file ERROR; others untouched."""
    late_a, late_b = upload(conn), upload(conn)
    publish(conn, tabular_timeout=0)
    ack(conn, late_a.job_id, late_a.file_id)  # processing
    on_time = upload(conn)
    publish(conn, tabular_timeout=600)
    assert scalar(conn, "SELECT arm.sweep_timeouts()") == 2
    for up in (late_a, late_b):
        row = job(conn, up.job_id)
        assert (row["status"], row["error_code"]) == ("timeout", "TIMEOUT")
        assert row["finished_at"] is not None
        assert stored_file(conn, up.file_id)["status"] == "ERROR"
    assert job(conn, on_time.job_id)["status"] == "published"
    assert stored_file(conn, on_time.file_id)["status"] == "UPLOADED"
    assert scalar(conn, "SELECT arm.sweep_timeouts()") == 0


def test_sweep_leaves_a_file_alone_when_the_job_is_not_current(conn: Conn) -> None:
    up = upload(conn)
    publish(conn, tabular_timeout=0)
    conn.execute(
        "UPDATE arm.stored_file SET current_recognition_job_id = NULL WHERE id = %s",
        (up.file_id,),
    )
    assert scalar(conn, "SELECT arm.sweep_timeouts()") == 1
    assert stored_file(conn, up.file_id)["status"] == "UPLOADED"


# --- schedule (run whatever is due) ------------------------------------------------


def test_schedule_is_visible_and_runs_the_sweep(conn: Conn) -> None:
    task = one_row(conn, "SELECT * FROM arm.periodic_task WHERE name = 'sweep_timeouts'")
    assert task is not None
    assert task["run_every"].total_seconds() == 30
    assert str(task["function_name"]) == "arm.sweep_timeouts()"

    up = upload(conn)
    publish(conn, tabular_timeout=0)
    ran = conn.execute(query("run_due_tasks")).fetchall()
    # (and the sample of the console's charts, due from the start)
    assert [r for r in ran if r["task"] != "sample_status"] == [
        {"task": "sweep_timeouts", "result": "1", "error": None}
    ]
    assert job(conn, up.job_id)["status"] == "timeout"
    # Not due again until run_every has passed.
    assert conn.execute(query("run_due_tasks")).fetchall() == []
    after = one_row(conn, "SELECT * FROM arm.periodic_task WHERE name = 'sweep_timeouts'")
    assert after["run_count"] == 1 and after["last_result"] == "1"
    assert (after["next_run_at"] - after["last_started_at"]).total_seconds() == 30


def test_concurrent_callers_run_a_due_task_once(db_url: str) -> None:
    callers = 8
    barrier = threading.Barrier(callers)

    def call() -> list[dict]:
        with dict_conn(db_url) as c:
            barrier.wait()
            return c.execute(query("run_due_tasks")).fetchall()

    with concurrent.futures.ThreadPoolExecutor(callers) as pool:
        runs = [r for rows in pool.map(lambda _: call(), range(callers)) for r in rows]
    assert sorted(r["task"] for r in runs) == ["sample_status", "sweep_timeouts"]  # each once
    with dict_conn(db_url) as c:
        counts = c.execute("SELECT run_count FROM arm.periodic_task").fetchall()
        assert [r["run_count"] for r in counts] == [1, 1]


def test_a_failing_task_records_its_error_and_others_still_run(conn: Conn) -> None:
    conn.execute("CREATE FUNCTION arm.broken_task() RETURNS int LANGUAGE sql AS 'SELECT 1/0'")
    conn.execute("SELECT arm.set_periodic_task('broken', 'arm.broken_task()', '1 minute')")
    ran = {r["task"]: r for r in conn.execute(query("run_due_tasks")).fetchall()}
    assert ran["sweep_timeouts"]["error"] is None
    assert "division by zero" in ran["broken"]["error"]
    row = one_row(conn, "SELECT * FROM arm.periodic_task WHERE name = 'broken'")
    assert "division by zero" in row["last_error"]


def test_a_dba_changes_the_sweep_period_with_sql(conn: Conn) -> None:
    conn.execute(
        "UPDATE arm.periodic_task SET run_every = interval '10 seconds' "
        "WHERE name = 'sweep_timeouts'"
    )
    conn.execute(query("run_due_tasks"))
    row = one_row(conn, "SELECT * FROM arm.periodic_task WHERE name = 'sweep_timeouts'")
    assert (row["next_run_at"] - row["last_started_at"]).total_seconds() == 10


def test_pg_cron_schedule_refuses_clearly_without_the_extension(conn: Conn) -> None:
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="pg_cron is not installed"):
        conn.execute("SELECT arm.schedule_with_pg_cron()")
