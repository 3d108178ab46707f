"""arm-core through a real PgBouncer in transaction mode (docs/dbas.md#through-pgbouncer):
Debian's `pgbouncer` run with docs/pgbouncer.ini in front of the suite's PostgreSQL;
`arm-core serve` and two `arm-core bridge` processes with DATABASE_URL through it
(DATABASE_POOLER=transaction) and the bridges' LISTEN direct (DATABASE_LISTEN_URL); the
reference service answering. An upload into the idle exchange goes out on its NOTIFY,
then a burst of uploads and retries through the API: every job done, each answer applied
once, each retry audited. And why the pool must prepare nothing there: psycopg's
default runs into another client's prepared statement on the shared server session."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from arm_core.config import Settings
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.pgbouncer import PgBouncer, pgbouncer_missing, running_pgbouncer
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, listening, log_lines, running_stack
from arm_core.devtools.testbed.sql import (
    API_LOGIN,
    BRIDGE_LOGIN,
    Login,
    as_login,
    dict_conn,
    scalar,
    upload,
)
from arm_core.runtime import make_pool
from tests.support.flow import applied_results

pytestmark = pytest.mark.e2e

# The bridges' fallback poll: long, so that only a NOTIFY explains a job published within
# WAKE_WITHIN of its upload into an idle exchange.
POLL_SECONDS = 120
WAKE_WITHIN = 10.0
BURST = 40
FAIL_ONCE_EVERY = 5  # every fifth file of the burst fails its first attempt: retried

# PgBouncer's logins and their passwords (userlist.txt); PostgreSQL itself trusts loopback.
PASSWORDS = {API_LOGIN.name: "api-Pw9xQ2vL7k", BRIDGE_LOGIN.name: "bridge-Pw9xQ2vL7k"}


@pytest.fixture
def bouncer(pg_server: EmbeddedPostgres) -> Iterator[PgBouncer]:
    if missing := pgbouncer_missing():
        pytest.skip(missing)
    assert pg_server.port is not None
    with running_pgbouncer(pg_server.port, PASSWORDS) as bouncer:
        yield bouncer


@pytest.fixture
def pooled_stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    yield from running_stack(db_url, tmp_path)


def through(bouncer: PgBouncer, db_url: str, login: Login) -> str:
    return bouncer.url(db_url.rsplit("/", 1)[1], login.name)


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as refused:  # its JSON error names the cause
        return refused.code, json.loads(refused.read() or b"{}")


def current(db_url: str) -> dict[str, tuple[int, str]]:
    """Every file's current job: (attempt, status), by file id."""
    with dict_conn(db_url) as conn:
        rows = conn.execute(
            "SELECT f.id::text AS file_id, j.attempt, j.status::text AS status "
            "FROM arm.stored_file f JOIN arm.recognition_job j "
            "ON j.id = f.current_recognition_job_id"
        ).fetchall()
    return {row["file_id"]: (row["attempt"], row["status"]) for row in rows}


async def test_serve_and_two_bridges_through_pgbouncer_in_transaction_mode(
    db_url: str, bouncer: PgBouncer, pooled_stack: Stack
) -> None:
    stack = pooled_stack
    env = {
        "DATABASE_POOLER": "transaction",
        "OUTBOX_POLL_SECONDS": POLL_SECONDS,
        "ACK_TIMEOUT_SECONDS": 30,  # no republish under a loaded machine's slower acks
        "DEBUG": "true",  # a log line per envelope applied, counted below
    }
    _, api = await asyncio.to_thread(
        stack.serve, DATABASE_URL=through(bouncer, db_url, API_LOGIN), NATS_ENABLED="false", **env
    )
    bridge_env = {
        **env,
        "DATABASE_URL": through(bouncer, db_url, BRIDGE_LOGIN),
        "DATABASE_LISTEN_URL": as_login(db_url, BRIDGE_LOGIN),
    }
    started = time.monotonic()  # no bridge polls again before started + POLL_SECONDS
    bridges = [await asyncio.to_thread(stack.bridge, **bridge_env) for _ in range(2)]
    reference = await listening(stack.reference())

    def listens() -> int:
        with dict_conn(db_url) as dba:
            return int(
                scalar(
                    dba,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND usename = %s AND query = 'LISTEN arm_recognition_job_queued'",
                    (BRIDGE_LOGIN.name,),
                )
            )

    # Each bridge's LISTEN on a session of its own, direct.
    await wait_for(lambda: listens() == 2, 10, "both bridges listening")

    # 1. Into the idle exchange: published on its NOTIFY, long before a poll could.
    with dict_conn(db_url) as conn:
        first = upload(conn)

    def published(job_id: uuid.UUID) -> bool:
        with dict_conn(db_url) as conn:
            status = scalar(
                conn, "SELECT status::text FROM arm.recognition_job WHERE id = %s", (job_id,)
            )
        return status != "queued"

    await wait_for(lambda: published(first.job_id), WAKE_WITHIN, "published on its NOTIFY")
    assert time.monotonic() - started < POLL_SECONDS, "too slow to tell a NOTIFY from a poll"

    # 2. A burst; every fifth file fails its first attempt, and is retried through the API.
    with dict_conn(db_url) as conn:
        burst = [
            upload(conn, "XLSX" if i % 2 else "PDF", name=f"ОСВ {i} [fail-once].xlsx")
            if i % FAIL_ONCE_EVERY == 0
            else upload(conn, "XLSX" if i % 2 else "PDF")
            for i in range(BURST)
        ]
    failing = {str(up.file_id) for i, up in enumerate(burst) if i % FAIL_ONCE_EVERY == 0}
    everyone = {str(up.file_id) for up in [first, *burst]}

    def first_attempts_final() -> bool:
        now = current(db_url)
        return all(now[f] == (1, "error" if f in failing else "done") for f in everyone)

    await wait_for(first_attempts_final, 90, lambda: f"first attempts: {current(db_url)}")
    # A double click: the same files twice in one request, then once more.
    status, body = post(f"{api}/api/v1/files/retry", {"file_ids": sorted(failing) * 2})
    assert status == 200, body
    assert len(body["results"]) == len(failing)
    assert {r["file_id"] for r in body["results"] if r["outcome"] == "retried"} == failing
    status, again = post(f"{api}/api/v1/files/retry", {"file_ids": sorted(failing)})
    assert status == 200, again
    assert {r["outcome"] for r in again["results"]} == {"skipped"}, again  # not failed now

    def all_done() -> bool:
        now = current(db_url)
        return all(now[f] == (2 if f in failing else 1, "done") for f in everyone)

    await wait_for(all_done, 90, lambda: f"every file done: {current(db_url)}")

    # Each answer applied once over both bridges, each request answered once.
    with dict_conn(db_url) as dba:
        jobs = [r["id"] for r in dba.execute("SELECT id::text FROM arm.recognition_job")]
        audit = dba.execute(
            "SELECT file_id::text, new_attempt, actor FROM arm.retry_audit"
        ).fetchall()
    assert len(jobs) == len(everyone) + len(failing)
    applied = applied_results([b.log() for b in bridges])
    assert {job: applied[job] for job in jobs} == dict.fromkeys(jobs, 1)
    assert len(log_lines(reference.log(), action="ref_result")) == len(jobs)
    assert sorted((a["file_id"], a["new_attempt"], a["actor"]) for a in audit) == sorted(
        (f, 2, "anonymous") for f in failing
    )
    for proc in stack.procs:
        assert "prepared statement" not in proc.log(), proc.command
    assert "unsupported startup parameter" not in bouncer.log()


async def test_through_a_transaction_pooler_psycopgs_default_prepares_into_another_client(
    db_url: str, pg_server: EmbeddedPostgres
) -> None:
    """Two connections of a pool, one server session behind them (default_pool_size
    = 1): with psycopg's default the second to run a statement five times prepares a
    name the first already prepared on that session; with DATABASE_POOLER=transaction
    neither prepares."""
    if missing := pgbouncer_missing():
        pytest.skip(missing)
    assert pg_server.port is not None
    with running_pgbouncer(pg_server.port, PASSWORDS, default_pool_size="1") as bouncer:
        url = through(bouncer, db_url, BRIDGE_LOGIN)
        for pooler, error in (
            ("none", psycopg.errors.DuplicatePreparedStatement),
            ("transaction", None),
        ):
            settings = Settings(
                database_url=url,
                database_pooler=pooler,
                nats_enabled=False,
                db_pool_max_size=2,
                db_idle_in_transaction_timeout_seconds=0,  # no startup option: both connect
            )
            pool = make_pool(settings)
            await pool.open(wait=True)
            try:
                async with pool.connection() as one, pool.connection() as two:
                    for _ in range(6):
                        await one.execute("SELECT count(*) FROM arm.recognition_job")
                    if error is None:
                        for _ in range(6):
                            await two.execute("SELECT count(*) FROM arm.recognition_job")
                    else:
                        with pytest.raises(error):
                            for _ in range(6):
                                await two.execute("SELECT count(*) FROM arm.recognition_job")
            finally:
                await pool.close()
