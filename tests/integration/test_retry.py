"""Manual retry as a DBA calls it (docs/behaviour.md#retry): arm.retry_file /
arm.retry_files create a new attempt atomically; races between real connections create
exactly one, and a retry racing the inbox or the timeout sweep on the same job never
deadlocks."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import random
import threading
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from arm_core.db import query
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.sql import (
    BRIDGE_LOGIN,
    SUPERUSER,
    Conn,
    Upload,
    ack,
    as_login,
    dict_conn,
    fail_by_no_ack,
    fail_by_timeout,
    job,
    jobs_of,
    publish,
    result,
    retry,
    scalar,
    stored_file,
    upload,
)

pytestmark = pytest.mark.integration

# The parameters of queries.sql's retry_file and retry_files as the API sends them, for
# the races below (each call adds its file or files).
SOLE: dict[str, Any] = {"actor": "x", "expected_job_id": None, "actor_level": "operator"}
MANY: dict[str, Any] = {"actor": "x", "expected_job_ids": None, "actor_level": "operator"}


def failed_upload(conn: Conn, file_type: str = "XLSX") -> Upload:
    """A tabular ОСВ РБ upload whose attempt 1 ended dlq / NO_ACK."""
    up = upload(conn, file_type, name="ОСВ РБ 2026-10.xlsx")
    publish(conn)
    fail_by_no_ack(conn)
    assert job(conn, up.job_id)["status"] == "dlq"
    return up


def test_S_RT_1_retry_after_no_ack_creates_attempt_2(conn: Conn) -> None:
    """S-RT-1: new queued attempt 2; same file and S3 object; file UPLOADED and pointing
    at the new job; the old row unchanged; an audit record in the same transaction."""
    up = failed_upload(conn)
    old_before = job(conn, up.job_id)
    file_before = stored_file(conn, up.file_id)

    out = retry(conn, up.file_id, actor="ivanova@arm")
    assert out["outcome"] == "retried" and out["attempt"] == 2
    assert out["previous_job_id"] == up.job_id and out["previous_status"] == "dlq"

    new = job(conn, out["job_id"])
    assert new["id"] != up.job_id
    assert (new["file_id"], new["pipeline"], new["attempt"]) == (up.file_id, "tabular", 2)
    assert new["max_attempts"] == old_before["max_attempts"]
    assert new["status"] == "queued"
    # R-RT-2: nothing of the old attempt carries over.
    for column in (
        "published_at",
        "request_msg_id",
        "request_subject",
        "reply_deadline",
        "started_at",
        "finished_at",
        "service_name",
        "service_version",
        "metrics",
        "error_code",
        "error_message",
        "result_schema_version",
        "result_s3_object_id",
        "result_msg_id",
        "group_schema",
        "last_published_at",
    ):
        assert new[column] is None, column
    assert new["republish_count"] == 0
    assert new["requested_at"] > old_before["requested_at"]

    assert job(conn, up.job_id) == old_before
    f = stored_file(conn, up.file_id)
    assert f["status"] == "UPLOADED"
    assert f["current_recognition_job_id"] == new["id"]
    assert f["s3_object_id"] == file_before["s3_object_id"] == up.s3_object_id
    assert f["consolidation_id"] == file_before["consolidation_id"]
    assert scalar(conn, "SELECT count(*) FROM arm.stored_file") == 1
    assert scalar(conn, "SELECT count(*) FROM arm.s3_object") == 1

    audit = conn.execute("SELECT * FROM arm.retry_audit").fetchall()
    assert len(audit) == 1
    assert (audit[0]["file_id"], audit[0]["old_job_id"], audit[0]["new_job_id"]) == (
        up.file_id,
        up.job_id,
        new["id"],
    )
    assert audit[0]["actor"] == "ivanova@arm" and audit[0]["new_attempt"] == 2


def test_the_new_attempt_is_published_with_its_own_id_and_deadline(
    conn: Conn,
) -> None:
    """R-RT-2 / S-RT-3 (SQL level): fresh reply_deadline and Nats-Msg-Id <new_id>:2."""
    up = failed_upload(conn)
    old = job(conn, up.job_id)
    new_id = retry(conn, up.file_id)["job_id"]
    [claimed] = publish(conn)
    assert claimed["job_id"] == new_id
    assert claimed["msg_id"] == f"{new_id}:2"
    assert claimed["request"]["attempt"] == 2
    new = job(conn, new_id)
    assert new["request_msg_id"] == f"{new_id}:2" != old["request_msg_id"]
    assert new["reply_deadline"] > old["reply_deadline"]


def test_S_RT_2_late_answers_of_the_old_attempt_change_nothing(conn: Conn) -> None:
    """S-RT-2: attempt 1 timed out, attempt 2 exists; an ack and a done for attempt 1
    leave the current job, the file and the result objects unchanged."""
    up = upload(conn)
    fail_by_timeout(conn, up)
    new_id = retry(conn, up.file_id)["job_id"]
    publish(conn)
    ack(conn, new_id, up.file_id)
    snapshot = (
        job(conn, up.job_id),
        job(conn, new_id),
        stored_file(conn, up.file_id),
        conn.execute("SELECT * FROM arm.s3_object ORDER BY id").fetchall(),
    )
    assert ack(conn, up.job_id, up.file_id)["outcome"] == "already_final"
    assert result(conn, up.job_id, up.file_id, "done")["outcome"] == "already_final"
    assert (
        result(conn, up.job_id, up.file_id, "error", msg_id="e", error=("UNREADABLE", "x"))[
            "outcome"
        ]
        == "already_final"
    )
    assert snapshot == (
        job(conn, up.job_id),
        job(conn, new_id),
        stored_file(conn, up.file_id),
        conn.execute("SELECT * FROM arm.s3_object ORDER BY id").fetchall(),
    )
    assert stored_file(conn, up.file_id)["status"] == "PROCESSING"


@pytest.mark.parametrize(
    ("drive", "reason"),
    [
        ("queued", "not_failed"),
        ("published", "not_failed"),
        ("processing", "not_failed"),
        ("done", "not_failed"),
        ("needs_check", "not_failed"),
    ],
)
def test_live_or_successful_jobs_are_not_retryable(conn: Conn, drive: str, reason: str) -> None:
    up = upload(conn)
    if drive != "queued":
        publish(conn)
    if drive == "processing":
        ack(conn, up.job_id, up.file_id)
    if drive in ("done", "needs_check"):
        result(conn, up.job_id, up.file_id, drive)
    before = (jobs_of(conn, up.file_id), stored_file(conn, up.file_id))
    out = retry(conn, up.file_id)
    assert (out["outcome"], out["reason"], out["job_id"]) == ("not_retryable", reason, None)
    assert out["previous_status"] == drive
    assert (jobs_of(conn, up.file_id), stored_file(conn, up.file_id)) == before
    assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 0


@pytest.mark.parametrize("failure", ["timeout", "dlq", "error"])
def test_every_unsuccessful_final_status_is_retryable(conn: Conn, failure: str) -> None:
    up = upload(conn)
    if failure == "timeout":
        fail_by_timeout(conn, up)
    elif failure == "dlq":
        publish(conn)
        fail_by_no_ack(conn)
    else:
        publish(conn)
        result(conn, up.job_id, up.file_id, "error", error=("UNREADABLE", "битый файл"))
    assert retry(conn, up.file_id)["outcome"] == "retried"


def test_attempts_are_limited_by_max_attempts(conn: Conn) -> None:
    up = failed_upload(conn)  # max_attempts 3 by default
    for attempt in (2, 3):
        out = retry(conn, up.file_id)
        assert (out["outcome"], out["attempt"]) == ("retried", attempt)
        publish(conn)
        fail_by_no_ack(conn)
    out = retry(conn, up.file_id)
    assert (out["outcome"], out["reason"]) == ("not_retryable", "attempts_exhausted")
    assert (out["previous_attempt"], out["max_attempts"]) == (3, 3)
    assert [j["attempt"] for j in jobs_of(conn, up.file_id)] == [1, 2, 3]


def test_unknown_file_and_file_without_job(conn: Conn) -> None:
    out = retry(conn, uuid.uuid4())
    assert (out["outcome"], out["reason"]) == ("not_found", "file_not_found")
    up = upload(conn)
    conn.execute(
        "UPDATE arm.stored_file SET current_recognition_job_id = NULL WHERE id = %s",
        (up.file_id,),
    )
    out = retry(conn, up.file_id)
    assert (out["outcome"], out["reason"]) == ("not_retryable", "no_job")


def test_retry_needs_an_actor(conn: Conn) -> None:
    up = failed_upload(conn)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="actor"):
        retry(conn, up.file_id, actor=" ")
    assert len(jobs_of(conn, up.file_id)) == 1


def test_R_RT_3_rollback_takes_job_switch_and_audit_back_together(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        up = failed_upload(conn)
        file_before = stored_file(conn, up.file_id)
        with pytest.raises(RuntimeError), conn.transaction():
            assert retry(conn, up.file_id)["outcome"] == "retried"
            raise RuntimeError("the caller fails after the retry")
        assert len(jobs_of(conn, up.file_id)) == 1
        assert stored_file(conn, up.file_id) == file_before
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 0


def test_retry_files_reports_each_file_once_and_goes_on(conn: Conn) -> None:
    failed, live, missing = failed_upload(conn), upload(conn), uuid.uuid4()
    rows = conn.execute(
        query("retry_files"),
        {
            "file_ids": [live.file_id, failed.file_id, missing, failed.file_id, None],
            "actor": "ops",
            "expected_job_ids": None,
            "actor_level": "operator",
        },
    ).fetchall()
    by_file = {r["file_id"]: r for r in rows}
    assert len(rows) == 3
    assert by_file[failed.file_id]["outcome"] == "retried"
    assert by_file[failed.file_id]["attempt"] == 2
    assert (by_file[live.file_id]["outcome"], by_file[live.file_id]["reason"]) == (
        "not_retryable",
        "not_failed",
    )
    assert by_file[missing]["outcome"] == "not_found"
    assert [j["attempt"] for j in jobs_of(conn, failed.file_id)] == [1, 2]


# --- Two requests against the same failed attempt never create two new jobs, also when
# the first request's attempt has already failed ----------------------------------------


def fail_fast(conn: Conn) -> None:
    """The new attempt fails within a second: published, never acked, dead-lettered."""
    publish(conn)
    fail_by_no_ack(conn)


def test_a_second_click_after_attempt_2_failed_fast_makes_no_attempt_3(
    conn: Conn,
) -> None:
    up = failed_upload(conn)
    first = retry(conn, up.file_id, "ivanova", expected_job_id=up.job_id)
    assert (first["outcome"], first["attempt"]) == ("retried", 2)
    fail_fast(conn)  # attempt 2 is dlq before the second click
    second = retry(conn, up.file_id, "petrov", expected_job_id=up.job_id)  # the same page
    assert (second["outcome"], second["reason"]) == ("not_retryable", "attempt_changed")
    assert (second["previous_job_id"], second["previous_status"], second["previous_attempt"]) == (
        first["job_id"],
        "dlq",
        2,
    )
    assert [j["attempt"] for j in jobs_of(conn, up.file_id)] == [1, 2]
    # Naming attempt 2, the one it now shows, retries it; naming none is today's behaviour.
    third = retry(conn, up.file_id, "petrov", expected_job_id=first["job_id"])
    assert (third["outcome"], third["attempt"]) == ("retried", 3)


def test_without_the_attempt_a_late_click_retries_whatever_failed_last(conn: Conn) -> None:
    """Documented: a caller that names no job gets the current one retried."""
    up = failed_upload(conn)
    assert retry(conn, up.file_id)["attempt"] == 2
    fail_fast(conn)
    assert retry(conn, up.file_id)["attempt"] == 3


def test_two_clicks_on_the_same_attempt_at_once_make_one_job(db_url: str) -> None:
    """Real connections: both name attempt 1; one retries, the other waits for the
    file's row and finds attempt 2 there — live or already failed, it is refused."""
    with dict_conn(db_url) as conn:
        up = failed_upload(conn)
    barrier = threading.Barrier(2)

    def click(actor: str) -> dict[str, Any]:
        with dict_conn(db_url) as c:
            barrier.wait()
            return retry(c, up.file_id, actor, expected_job_id=up.job_id)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(click, ["ivanova", "petrov"]))
    assert sorted(a["outcome"] for a in answers) == ["not_retryable", "retried"]
    refused = next(a for a in answers if a["outcome"] == "not_retryable")
    assert refused["reason"] == "attempt_changed"
    with dict_conn(db_url) as conn:
        assert [j["attempt"] for j in jobs_of(conn, up.file_id)] == [1, 2]


def test_a_batch_names_the_attempt_of_each_file(conn: Conn) -> None:
    moved, same = failed_upload(conn), failed_upload(conn)
    old = moved.job_id
    retry(conn, moved.file_id, expected_job_id=old)
    fail_fast(conn)
    rows = conn.execute(
        query("retry_files"),
        {
            "file_ids": [moved.file_id, same.file_id, moved.file_id],
            "actor": "ops",
            "expected_job_ids": [old, same.job_id, None],  # a file named twice: its first
            "actor_level": "operator",
        },
    ).fetchall()
    by_file = {r["file_id"]: r for r in rows}
    assert (by_file[moved.file_id]["outcome"], by_file[moved.file_id]["reason"]) == (
        "not_retryable",
        "attempt_changed",
    )
    assert (by_file[same.file_id]["outcome"], by_file[same.file_id]["attempt"]) == ("retried", 2)
    assert [j["attempt"] for j in jobs_of(conn, moved.file_id)] == [1, 2]


# --- the audit records the access level the actor retried with -------------------------


def audit_levels(conn: Conn) -> dict[uuid.UUID, list[tuple[str, str | None]]]:
    """(actor, actor_level) of every audit record, by file, oldest first."""
    found: dict[uuid.UUID, list[tuple[str, str | None]]] = {}
    for row in conn.execute("SELECT file_id, actor, actor_level FROM arm.retry_audit ORDER BY id"):
        found.setdefault(row["file_id"], []).append((row["actor"], row["actor_level"]))
    return found


@pytest.mark.parametrize("level", ["operator", "all"])
def test_the_audit_records_the_level_the_api_retried_with(conn: Conn, level: str) -> None:
    up = failed_upload(conn)
    assert retry(conn, up.file_id, "ivanova@arm", actor_level=level)["outcome"] == "retried"
    assert audit_levels(conn) == {up.file_id: [("ivanova@arm", level)]}
    assert (
        scalar(conn, "SELECT arm.get_file(%s)", (up.file_id,))["retries"][0]["actor_level"] == level
    )


@pytest.mark.parametrize(
    "call",
    [
        "SELECT * FROM arm.retry_file_v3(%(file)s, 'dba', NULL, NULL)",
        "SELECT * FROM arm.retry_file_v2(%(file)s, 'dba', NULL)",
        "SELECT * FROM arm.retry_file(%(file)s, 'dba')",
        "SELECT * FROM arm.retry_files_v3(ARRAY[%(file)s], 'dba', NULL, NULL)",
        "SELECT * FROM arm.retry_files_v2(ARRAY[%(file)s], 'dba', NULL)",
        "SELECT * FROM arm.retry_files(ARRAY[%(file)s], 'dba')",
    ],
    ids=["file_v3", "file_v2", "file", "files_v3", "files_v2", "files"],
)
def test_a_retry_without_a_level_records_none(conn: Conn, call: str) -> None:
    """A DBA's SQL, and the previous release's API through the older names: the audit
    says no level rather than guess one."""
    up = failed_upload(conn)
    [row] = conn.execute(call, {"file": up.file_id}).fetchall()
    assert (row["outcome"], row["attempt"]) == ("retried", 2)
    assert audit_levels(conn) == {up.file_id: [("dba", None)]}
    assert (
        scalar(conn, "SELECT arm.get_file(%s)", (up.file_id,))["retries"][0]["actor_level"] is None
    )


@pytest.mark.parametrize("level", ["viewer", "metrics", "Operator", "", " all"])
def test_a_level_other_than_operator_or_all_is_refused_and_writes_nothing(
    db_url: str, level: str
) -> None:
    with dict_conn(db_url) as conn:
        failed, live = failed_upload(conn), upload(conn)
        before = {f: jobs_of(conn, f) for f in (failed.file_id, live.file_id)}
        files = {f: stored_file(conn, f) for f in (failed.file_id, live.file_id)}
        calls = [
            (query("retry_file"), {**SOLE, "file_id": failed.file_id, "actor_level": level}),
            # Refused before anything is read: also for a file that is not retryable.
            (query("retry_file"), {**SOLE, "file_id": live.file_id, "actor_level": level}),
            (
                query("retry_files"),
                {**MANY, "file_ids": [live.file_id, failed.file_id], "actor_level": level},
            ),
        ]
        for sql, params in calls:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="p_actor_level"):
                conn.execute(sql, params)
        assert {f: jobs_of(conn, f) for f in before} == before
        assert {f: stored_file(conn, f) for f in files} == files
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 0


def test_the_table_refuses_a_level_written_around_the_functions(conn: Conn) -> None:
    """A DBA's own write to the audit (the owner's rights, no function) is checked too."""
    up = failed_upload(conn)
    retry(conn, up.file_id, "ivanova", actor_level="all")
    with pytest.raises(psycopg.errors.CheckViolation, match="retry_audit_actor_level"):
        conn.execute("UPDATE arm.retry_audit SET actor_level = 'viewer'")
    assert audit_levels(conn) == {up.file_id: [("ivanova", "all")]}


def test_a_batch_records_the_level_for_every_file_it_retries(conn: Conn) -> None:
    first, second, live = failed_upload(conn), failed_upload(conn), upload(conn)
    rows = conn.execute(
        query("retry_files"),
        {
            **MANY,
            "actor": "petrov",
            "file_ids": [first.file_id, live.file_id, second.file_id],
            "actor_level": "all",
        },
    ).fetchall()
    assert sorted(r["outcome"] for r in rows) == ["not_retryable", "retried", "retried"]
    assert audit_levels(conn) == {
        first.file_id: [("petrov", "all")],
        second.file_id: [("petrov", "all")],
    }


# --- concurrency (R-RT-3, S-RT-4): real connections racing -------------------------


def _race(db_url: str, calls: list[tuple[str, object]]) -> list[list[dict]]:
    """Runs each call on its own connection, all released at once by a barrier."""
    barrier = threading.Barrier(len(calls))

    def run(call: tuple[str, object]) -> list[dict]:
        kind, arg = call
        with dict_conn(db_url) as c:
            barrier.wait()
            if kind == "one":
                return c.execute(query("retry_file"), {**SOLE, "file_id": arg}).fetchall()
            return c.execute(query("retry_files"), {**MANY, "file_ids": arg}).fetchall()

    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _attempts(db_url: str, file_id: uuid.UUID) -> list[int]:
    with dict_conn(db_url) as c:
        return [j["attempt"] for j in jobs_of(c, file_id)]


# Deterministic races: a DBA's transaction holds the file's row while the racing calls
# start, one after another, each on a session of its own; each is seen waiting for a
# lock (pg_stat_activity) before the next starts, so they queue for the row in that
# order. Then the row is released. The superuser's sessions detect a deadlock after
# 10 ms (deadlock_timeout): a lock order that could deadlock fails the test at once.

Session = psycopg.AsyncConnection[dict[str, Any]]
Call = tuple[str, Callable[[Session], Coroutine[Any, Any, Any]]]


async def _session(stack: contextlib.AsyncExitStack, url: str) -> Session:
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, row_factory=dict_row)
    await stack.enter_async_context(conn)
    await conn.execute("SET lock_timeout = '20s'")  # a hang fails the test, never hangs it
    if url.startswith(f"postgresql://{SUPERUSER}@"):
        await conn.execute("SET deadlock_timeout = '10ms'")
    return conn


async def _all_waiting_for_a_lock(observer: Session, sessions: list[Session]) -> bool:
    pids = [s.info.backend_pid for s in sessions]
    cur = await observer.execute(
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE pid = ANY(%s) AND state = 'active' AND wait_event_type = 'Lock'",
        (pids,),
    )
    row = await cur.fetchone()
    return row is not None and row["n"] == len(pids)


async def race_behind_the_file(db_url: str, file_id: uuid.UUID, calls: list[Call]) -> list[Any]:
    """Runs `calls` (a database URL and what to do on a session to it) while the file's
    row is held, in the order given, each waiting before the next starts; releases the
    row and returns what each call returned."""
    async with contextlib.AsyncExitStack() as stack:
        dba, observer = await _session(stack, db_url), await _session(stack, db_url)
        sessions: list[Session] = []
        tasks: list[asyncio.Task[Any]] = []
        try:
            async with dba.transaction():
                await dba.execute(
                    "SELECT 1 FROM arm.stored_file WHERE id = %s FOR UPDATE", (file_id,)
                )
                for url, call in calls:
                    sessions.append(await _session(stack, url))
                    tasks.append(asyncio.create_task(call(sessions[-1])))
                    await wait_for(
                        lambda: _all_waiting_for_a_lock(observer, sessions),
                        10,
                        f"{len(sessions)} of {len(calls)} waiting for a lock",
                    )
            return await asyncio.wait_for(asyncio.gather(*tasks), 30)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def retrying(file_id: uuid.UUID) -> Callable[[Session], Coroutine[Any, Any, dict[str, Any]]]:
    async def call(session: Session) -> dict[str, Any]:
        cur = await session.execute(query("retry_file"), {**SOLE, "file_id": file_id})
        row = await cur.fetchone()
        assert row is not None
        return row

    return call


def applying_an_error_result(
    up: Upload,
) -> Callable[[Session], Coroutine[Any, Any, list[dict[str, Any]]]]:
    """The inbox's statement (arm.apply_envelopes_v2) with the job's `error` result."""
    answer = {
        "job_id": str(up.job_id),
        "file_id": str(up.file_id),
        "msg_id": f"result:{up.job_id}:1",
        "status": "error",
        "service_name": "tabular-parser",
        "service_version": "1.4.2",
        "error_code": "UNREADABLE",
        "error_message": "битый файл",
    }

    async def call(session: Session) -> list[dict[str, Any]]:
        cur = await session.execute(query("apply_envelopes"), {"envelopes": Jsonb([answer])})
        return await cur.fetchall()

    return call


async def sweeping(session: Session) -> int:
    """The timeout sweep, as the schedule runs it."""
    cur = await session.execute("SELECT arm.sweep_timeouts() AS n")
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def test_S_RT_4_two_retries_queued_for_the_file_create_exactly_one_attempt(
    db_url: str,
) -> None:
    """S-RT-4: two retries of attempt 1 both wait for the file's row; released, the
    first creates attempt 2 and the second, seeing it, is refused (not_failed → the
    API's 409 FILE_NOT_RETRYABLE): one attempt 2, no attempt 3, one audit record."""
    with dict_conn(db_url) as conn:
        up = failed_upload(conn)
    first, second = await race_behind_the_file(
        db_url, up.file_id, [(db_url, retrying(up.file_id)), (db_url, retrying(up.file_id))]
    )
    assert (first["outcome"], first["attempt"]) == ("retried", 2)
    assert (second["outcome"], second["reason"]) == ("not_retryable", "not_failed")
    assert second["previous_job_id"] == first["job_id"]
    assert _attempts(db_url, up.file_id) == [1, 2]
    with dict_conn(db_url) as conn:
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 1


@pytest.mark.parametrize("retry_first", [True, False], ids=["retry_first", "inbox_first"])
async def test_retry_and_the_inbox_on_one_job_never_deadlock(
    db_url: str, retry_first: bool
) -> None:
    """A retry of the file and the inbox applying its live job's `error` result, queued
    for the file's row in either order. The inbox locks the job, then the file; retry
    locks only the file and reads the job without locking it (50_retry.sql), so neither
    waits for the other in a cycle. Retry first: it sees the job still live and is
    refused, then the result applies (job error, file ERROR). Inbox first: the result
    applies, then the retry sees the error and creates attempt 2."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn)
        ack(conn, up.job_id, up.file_id)
    retry_call: Call = (db_url, retrying(up.file_id))
    inbox_call: Call = (as_login(db_url, BRIDGE_LOGIN), applying_an_error_result(up))
    calls = [retry_call, inbox_call] if retry_first else [inbox_call, retry_call]
    returned = await race_behind_the_file(db_url, up.file_id, calls)
    retried, [applied] = returned if retry_first else returned[::-1]

    assert (applied["outcome"], applied["status"]) == ("applied", "error")
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "error"
        if retry_first:
            assert (retried["outcome"], retried["reason"]) == ("not_retryable", "not_failed")
            assert retried["previous_status"] == "processing"
            assert stored_file(conn, up.file_id)["status"] == "ERROR"
            assert retry(conn, up.file_id)["outcome"] == "retried"  # nothing left stuck
        else:
            assert (retried["outcome"], retried["previous_status"]) == ("retried", "error")
            assert stored_file(conn, up.file_id)["status"] == "UPLOADED"
    assert _attempts(db_url, up.file_id) == [1, 2]


@pytest.mark.parametrize("retry_first", [True, False], ids=["retry_first", "sweep_first"])
async def test_retry_and_the_timeout_sweep_on_one_job_never_deadlock(
    db_url: str, retry_first: bool
) -> None:
    """A retry of the file and the timeout sweep of its overdue job, queued for the
    file's row in either order: the sweep locks the job, then the file; retry only the
    file. Retry first: the job is still live to it, it is refused, then the sweep times
    the job out (file ERROR). Sweep first: the job times out, then the retry creates
    attempt 2."""
    with dict_conn(db_url) as conn:
        up = upload(conn)
        publish(conn, tabular_timeout=0)  # overdue at once
    retry_call: Call = (db_url, retrying(up.file_id))
    sweep_call: Call = (db_url, sweeping)
    calls = [retry_call, sweep_call] if retry_first else [sweep_call, retry_call]
    returned = await race_behind_the_file(db_url, up.file_id, calls)
    retried, swept = returned if retry_first else returned[::-1]

    assert swept == 1
    with dict_conn(db_url) as conn:
        assert job(conn, up.job_id)["status"] == "timeout"
        if retry_first:
            assert (retried["outcome"], retried["reason"]) == ("not_retryable", "not_failed")
            assert retried["previous_status"] == "published"
            assert stored_file(conn, up.file_id)["status"] == "ERROR"
            assert retry(conn, up.file_id)["outcome"] == "retried"
        else:
            assert (retried["outcome"], retried["previous_status"]) == ("retried", "timeout")
            assert stored_file(conn, up.file_id)["status"] == "UPLOADED"
    assert _attempts(db_url, up.file_id) == [1, 2]


def test_S_RT_4_stress_50_concurrent_retries_of_one_file(db_url: str) -> None:
    with dict_conn(db_url) as conn:
        up = failed_upload(conn)
    results = _race(db_url, [("one", up.file_id)] * 50)
    outcomes = [r[0]["outcome"] for r in results]
    assert outcomes.count("retried") == 1
    assert outcomes.count("not_retryable") == 49
    assert _attempts(db_url, up.file_id) == [1, 2]
    with dict_conn(db_url) as conn:
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 1


def test_S_RT_4_stress_singles_and_batches_over_many_files(db_url: str) -> None:
    """Concurrent retries of 20 files by singles and by overlapping batches in shuffled
    order: each file gets exactly one attempt 2, no deadlock, no attempt 3; a batch
    marks a file it lost the race for as not retryable (the API's `skipped`)."""
    with dict_conn(db_url) as conn:
        files = [failed_upload(conn).file_id for _ in range(20)]
    rng = random.Random(4)
    calls: list[tuple[str, object]] = [("one", f) for f in files for _ in range(2)]
    for _ in range(8):
        batch = rng.sample(files, 10)
        calls.append(("batch", batch))
    rng.shuffle(calls)
    results = _race(db_url, calls)
    retried = [row["file_id"] for rows in results for row in rows if row["outcome"] == "retried"]
    assert sorted(retried) == sorted(files)  # each file exactly once
    refused = {row["outcome"] for rows in results for row in rows} - {"retried"}
    assert refused == {"not_retryable"}
    for f in files:
        assert _attempts(db_url, f) == [1, 2]
