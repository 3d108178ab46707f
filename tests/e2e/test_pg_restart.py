"""PostgreSQL restarted under a flood of answers (issue 12, part 4).

A real `arm-core serve` (API and bridge in one process, NATS enabled) against a
PostgreSQL of the test's own, and an instant service that acks and answers every
request at once. While answers are being applied, PostgreSQL is restarted as an
operator does (`pg_ctl restart -m fast`) or crashes (`pg_ctl stop -m immediate`, down a
few seconds, then started). Every answer is applied exactly once, the API answers 503
JSON while the database is down, /healthcheck says so and then recovers, and every job
ends done — with no restart of `serve`."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from arm_core.devtools.embedded import EmbeddedPostgres
from arm_core.migrate import migrate
from tests.support.bridge import instant_service, wait_for
from tests.support.processes import ArmProcess, log_lines
from tests.support.sql import dict_conn, ensure_logins, upload, upload_many
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.e2e

JOBS = 1500
# Answers are in flight when the fault lands: the first ones applied, most still coming.
FAULT_AFTER_DONE = 200
DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"


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


def count(url: str, sql: str) -> int:
    """A fresh connection each time: the server under test goes away and comes back."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(sql).fetchone()
    except psycopg.OperationalError:
        return -1
    assert row is not None
    return int(row[0])


def by_status(url: str) -> dict[str, int]:
    with dict_conn(url) as conn:
        rows = conn.execute(
            "SELECT status::text AS s, count(*) AS n FROM arm.recognition_job GROUP BY 1"
        ).fetchall()
    return {r["s"]: r["n"] for r in rows}


def http_get(url: str) -> tuple[int, dict[str, Any]]:
    """GET with a deadline: a hang fails the test as a timeout, not a pass."""
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def start_flood(stack: Stack) -> tuple[ArmProcess, str, Any]:
    """JOBS queued uploads (and one known file for the API), serve, an instant service."""
    with dict_conn(stack.db_url) as conn:
        known = upload(conn)
        upload_many(conn, JOBS - 1)
    # DEBUG: a log line per envelope applied. A short pool timeout: the API's 503 comes
    # within seconds while the database is down.
    serve, api = stack.serve(DEBUG="true", DATABASE_POOL_TIMEOUT_SECONDS=2)
    service = await instant_service(stack.nats.url())
    await wait_for(
        lambda: count(stack.db_url, DONE) >= FAULT_AFTER_DONE, 60, "the first answers applied"
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
    assert FAULT_AFTER_DONE <= len(applied) <= JOBS


async def test_pg_restart_fast_under_a_flood_of_answers(stack: Stack, pg: EmbeddedPostgres) -> None:
    serve, api, (known, service) = await start_flood(stack)
    try:
        done_before = count(stack.db_url, DONE)
        await asyncio.to_thread(pg.restart, "fast")
        assert done_before < JOBS, "the flood was over before the restart: nothing was in flight"
        await assert_every_answer_applied_once(stack, serve)
        status, health = await asyncio.to_thread(http_get, f"{api}/healthcheck")
        assert status == 200 and health["db"] == "ok", health
        status, body = await asyncio.to_thread(http_get, f"{api}/api/v1/files/{known.file_id}")
        assert status == 200 and body["current_job"]["status"] == "done"
    finally:
        await service.client.close()


async def test_pg_stop_immediate_then_start_under_a_flood_of_answers(
    stack: Stack, pg: EmbeddedPostgres
) -> None:
    serve, api, (known, service) = await start_flood(stack)
    try:
        await asyncio.to_thread(pg.stop, "immediate")
        assert count(stack.db_url, DONE) == -1  # really down
        # While down: the API answers 503 JSON (not a hang, not a 500), health says why.
        status, body = await asyncio.to_thread(http_get, f"{api}/api/v1/files/{known.file_id}")
        assert status == 503 and body["error"]["code"] == "DATABASE_UNAVAILABLE", body
        status, health = await asyncio.to_thread(http_get, f"{api}/healthcheck")
        assert status == 503 and health["db"].startswith("unavailable"), health
        assert health["status"] == "degraded"
        await asyncio.sleep(3)  # the outage lasts a few seconds; answers keep arriving
        await asyncio.to_thread(pg.start)
        await wait_for(lambda: http_get(f"{api}/healthcheck")[1]["db"] == "ok", 60, "health back")
        await assert_every_answer_applied_once(stack, serve)
        status, body = await asyncio.to_thread(http_get, f"{api}/api/v1/files/{known.file_id}")
        assert status == 200 and body["current_job"]["status"] == "done"
    finally:
        await service.client.close()
