"""A request that a concurrent transaction rolls back is not an outage: a retry of two
files meets a transaction that locks the same files in the other order — what a batch
of answers applied by the inbox does — and PostgreSQL breaks the deadlock by rolling
the retry back. The store sends it again and the operator sees the files retried; with
no try left the API answers 503 DATABASE_CONFLICT with Retry-After, nothing of the
request done. Neither logs `db_outage` (psycopg makes a deadlock an OperationalError,
as it makes a lost connection one)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient
from psycopg.rows import dict_row

import arm_core.store
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.sql import API_LOGIN, dict_conn, fail_by_timeout, scalar, upload
from tests.support.api import api_settings, running_api
from tests.support.bridge import logged

pytestmark = pytest.mark.integration

Session = psycopg.AsyncConnection[dict[str, Any]]


async def waiting_on_a_lock(watcher: Session) -> int:
    cur = await watcher.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
        "AND usename = %s AND wait_event_type = 'Lock'",
        (API_LOGIN.name,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def deadlocks(watcher: Session) -> int:
    cur = await watcher.execute(
        "SELECT deadlocks AS n FROM pg_stat_database WHERE datname = current_database()"
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


def two_failed_files(db_url: str) -> list[uuid.UUID]:
    """Two files whose only attempt timed out, in id order."""
    with dict_conn(db_url) as conn:
        ups = [upload(conn) for _ in range(2)]
        fail_by_timeout(conn, ups[0])  # publishes both, with no time to answer
    return sorted(up.file_id for up in ups)


@contextlib.asynccontextmanager
async def sessions(db_url: str) -> AsyncIterator[tuple[Session, Session]]:
    """The other transaction's session, and one that watches. The other one waits far
    longer than the API's session (1 s, the server's default) before it looks for a
    deadlock, so it is the API's call that PostgreSQL rolls back."""
    async with (
        await psycopg.AsyncConnection.connect(db_url, row_factory=dict_row) as other,
        await psycopg.AsyncConnection.connect(
            db_url, autocommit=True, row_factory=dict_row
        ) as watcher,
    ):
        await other.execute("SET deadlock_timeout = '60s'")
        await other.execute("SET lock_timeout = '30s'")  # a hang fails the test
        await other.commit()
        yield other, watcher


async def retry_across_a_deadlock(
    http: TestClient, files: list[uuid.UUID], other: Session, watcher: Session
) -> asyncio.Future[Any]:
    """POST /api/v1/files/retry of `files` while `other` holds the second and then asks
    for the first; returns once PostgreSQL has broken the deadlock, with the request."""
    lock = "SELECT 1 FROM arm.stored_file WHERE id = %s FOR NO KEY UPDATE"
    await other.execute(lock, (files[1],))
    request = asyncio.ensure_future(
        http.post("/api/v1/files/retry", json={"file_ids": [str(f) for f in files]})
    )

    async def the_retry_waits() -> bool:
        return await waiting_on_a_lock(watcher) == 1

    # The retry holds the first file and waits for the second.
    await wait_for(the_retry_waits, 10, "the retry waits for the second file")
    # The other transaction asks for the first: a deadlock, which the API's session finds
    # (it waited first) and PostgreSQL breaks by rolling the retry back — only then does
    # the first file come free, and this statement return.
    await other.execute(lock, (files[0],))
    return request


async def test_a_retry_rolled_back_by_a_deadlock_goes_again_and_is_no_outage(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    files = two_failed_files(db_url)
    async with running_api(api_settings(db_url)) as http, sessions(db_url) as (other, watcher):
        before = await deadlocks(watcher)
        request = await retry_across_a_deadlock(http, files, other, watcher)

        async def the_second_try_waits() -> bool:
            return await waiting_on_a_lock(watcher) == 1

        # The store sends the retry again: it waits for the first file, which the other
        # transaction now holds, until that commits.
        await wait_for(the_second_try_waits, 10, "the second try waits for the first file")
        await other.commit()
        resp = await request
        body = await resp.json()
        assert resp.status == 200, body
        assert [(r["file_id"], r["outcome"]) for r in body["results"]] == [
            (str(f), "retried") for f in files
        ]

        async def counted() -> bool:  # a session reports its statistics when idle
            return await deadlocks(watcher) == before + 1

        await wait_for(counted, 15, "one deadlock in pg_stat_database")
    with dict_conn(db_url) as conn:
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 2
    [again] = logged(caplog.records, action="db_conflict")
    assert "retry_files" in again.getMessage() and "deadlock detected" in again.getMessage()
    assert not logged(caplog.records, action="db_outage")


async def test_a_retry_still_in_conflict_after_every_try_is_a_503_that_did_nothing(
    db_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(arm_core.store, "CONFLICT_RETRIES", 0)  # no second try
    files = two_failed_files(db_url)
    async with running_api(api_settings(db_url)) as http, sessions(db_url) as (other, watcher):
        request = await retry_across_a_deadlock(http, files, other, watcher)
        resp = await request
        body = await resp.json()
        await other.commit()
    assert resp.status == 503, body
    assert body["error"]["code"] == "DATABASE_CONFLICT", body
    assert resp.headers["Retry-After"] == "1"
    with dict_conn(db_url) as conn:
        assert scalar(conn, "SELECT count(*) FROM arm.retry_audit") == 0
        statuses = conn.execute(
            "SELECT j.status::text AS s FROM arm.stored_file f "
            "JOIN arm.recognition_job j ON j.id = f.current_recognition_job_id"
        ).fetchall()
    assert [r["s"] for r in statuses] == ["timeout", "timeout"]  # still retryable
    assert not logged(caplog.records, action="db_conflict")
    assert not logged(caplog.records, action="db_outage")
    assert logged(caplog.records, action="http")  # the refusal is logged, with its cause
