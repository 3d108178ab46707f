"""PostgreSQL restarted under a flood of answers.

A real `arm-core serve` (API and bridge in one process, NATS enabled) against a
PostgreSQL of the test's own, and an instant service that acks every request at once
and answers the first ones at once, holding the other results back. PostgreSQL goes down
as an operator restarts it (`pg_ctl stop -m fast`, then start: what `pg_ctl restart -m
fast` does) or crashes (`pg_ctl stop -m immediate`), and only then are the held results
sent: they reach serve while the database is down, and it starts again once serve holds
answers it cannot apply. So the fault is always in the flow, however fast the machine:
most answers are applied after it, every one exactly once, the API answers 503 JSON
while the database is down, /healthcheck says so and then recovers, and every job ends
done — with no restart of `serve`."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.faults import by_status, count, http_get
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, Stack, log_lines, running_stack
from arm_core.devtools.testbed.services import instant_service
from arm_core.devtools.testbed.sql import dict_conn, ensure_logins, upload, upload_many
from arm_core.migrate import migrate

pytestmark = pytest.mark.e2e

JOBS = 1500
# Answered before the fault; the results of the other jobs come only after it.
ANSWERED_BEFORE = 200
DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"
PROCESSING = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
# Jobs whose result was applied since the server (re)started.
APPLIED_SINCE_START = (
    "SELECT count(*) FROM arm.recognition_job WHERE finished_at >= pg_postmaster_start_time()"
)


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own: restarting the suite's would break every other test."""
    server = EmbeddedPostgres(base_dir=tmp_path / "pg").start()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def stack(pg: EmbeddedPostgres, tmp_path: Path) -> Iterator[Stack]:
    pg.create_database("arm")
    url = pg.url("arm")
    # The embedded server runs with synchronous_commit=off for speed; a crash
    # (-m immediate) then loses commits already reported to the client — an answer the
    # bridge saw applied would vanish. Production runs with it on, and so does this
    # database (a database's setting overrides the server's command line).
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("ALTER DATABASE arm SET synchronous_commit = on")
    migrate(url)
    ensure_logins(url)
    yield from running_stack(url, tmp_path)


def inbox_buffered(api: str) -> float:
    """serve's arm_inbox_buffered: answers received and waiting in its inbox."""
    with urllib.request.urlopen(f"{api}/metrics", timeout=15) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("arm_inbox_buffered "):
                return float(line.split()[1])
    raise AssertionError("no arm_inbox_buffered in /metrics")


async def start_flood(stack: Stack) -> tuple[ArmProcess, str, Any]:
    """JOBS queued uploads (and one known file for the API), serve, and an instant
    service that answers the first ANSWERED_BEFORE requests at once and holds the other
    results back; returns once those answers are applied and every other job is acked."""
    with dict_conn(stack.db_url) as conn:
        known = upload(conn)
        upload_many(conn, JOBS - 1)
    # DEBUG: a log line per envelope applied. A short pool timeout: the API's 503 comes
    # within seconds while the database is down. ACK_TIMEOUT_SECONDS as in production:
    # every request is acked at once, none is to be republished for a slow machine.
    serve, api = stack.serve(  # unpaced: the whole burst answered at once, a flood
        DEBUG="true", DATABASE_POOL_TIMEOUT_SECONDS=2, ACK_TIMEOUT_SECONDS=30, PACING="off"
    )
    service = await instant_service(stack.nats.url(), answer_first=ANSWERED_BEFORE)
    url = stack.db_url
    await wait_for(
        lambda: (
            count(url, DONE) == ANSWERED_BEFORE and count(url, PROCESSING) == JOBS - ANSWERED_BEFORE
        ),
        60,
        lambda: f"the first answers applied, the rest acked; by status: {by_status(url)}",
    )
    return serve, api, (known, service)


async def assert_every_answer_applied_once(stack: Stack, serve: ArmProcess) -> None:
    url = stack.db_url
    await wait_for(
        lambda: count(url, DONE) == JOBS,
        180,
        lambda: f"all {JOBS} jobs done; by status: {by_status(url)}",
    )
    with dict_conn(url) as conn:
        assert by_status(url) == {"done": JOBS}
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE result_msg_id = 'result:' || id || ':1') AS msg_ids,"
            "       count(DISTINCT result_s3_object_id) AS objects "
            "FROM arm.recognition_job"
        ).fetchone()
        assert row == {"msg_ids": JOBS, "objects": JOBS}
        # No duplicate side effect: one result object per job, none left over.
        results = conn.execute(
            "SELECT count(*) AS n FROM arm.s3_object WHERE bucket_role = 'results'"
        ).fetchone()
        assert results == {"n": JOBS}
        files = conn.execute(
            "SELECT count(*) AS n FROM arm.stored_file f JOIN arm.recognition_job j "
            "ON j.id = f.current_recognition_job_id WHERE j.status = 'done'"
        ).fetchone()
        assert files == {"n": JOBS}
    # serve ran throughout: never restarted, never crashed. Its log never names a job
    # applied twice; it may name fewer than the database holds — a batch whose commit
    # succeeded as the server went down is, for the bridge, unknown: it holds the batch
    # and applies it again, and the database answers `duplicate` (the exact count is
    # the database's, above).
    assert serve.proc.poll() is None, serve.log()[-3000:]
    applied = Counter(
        line.split(" job_id=")[1].split()[0]
        for line in log_lines(serve.log(), action="result")
        if "result applied" in line
    )
    assert set(applied.values()) == {1}, applied.most_common(3)
    assert ANSWERED_BEFORE <= len(applied) <= JOBS


@pytest.mark.parametrize("mode", ["fast", "immediate"], ids=["restart_fast", "crash"])
async def test_pg_down_under_a_flood_of_answers(
    stack: Stack, pg: EmbeddedPostgres, mode: str
) -> None:
    serve, api, (known, service) = await start_flood(stack)
    try:
        await asyncio.to_thread(pg.stop, mode)
        assert count(stack.db_url, DONE) == -1  # really down
        # While down: the API answers 503 JSON (not a hang, not a 500), health says why.
        status, body = await asyncio.to_thread(http_get, f"{api}/api/v1/files/{known.file_id}")
        assert status == 503 and body["error"]["code"] == "DATABASE_UNAVAILABLE", body
        status, health = await asyncio.to_thread(http_get, f"{api}/healthcheck")
        assert status == 503 and health["db"].startswith("unavailable"), health
        assert health["status"] == "degraded"
        # The answers arrive while the database is down; serve holds them.
        assert await service.release() == JOBS - ANSWERED_BEFORE
        await wait_for(
            lambda: inbox_buffered(api) > 0, 30, "serve holds answers it cannot apply yet"
        )
        await asyncio.to_thread(pg.start)
        await wait_for(lambda: http_get(f"{api}/healthcheck")[1]["db"] == "ok", 60, "health back")
        await assert_every_answer_applied_once(stack, serve)
        assert count(stack.db_url, APPLIED_SINCE_START) == JOBS - ANSWERED_BEFORE
        status, body = await asyncio.to_thread(http_get, f"{api}/api/v1/files/{known.file_id}")
        assert status == 200 and body["current_job"]["status"] == "done"
    finally:
        await service.client.close()
