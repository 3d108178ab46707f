"""PostgreSQL failover under a steady flow: the primary's machine dies, the synchronous
standby is promoted, and nothing is lost, applied twice or left stuck.

A primary and a streaming standby of the test's own on loopback (`pg_basebackup -R`),
the primary with `synchronous_standby_names` naming the standby, so a commit returns
only once the standby has its WAL. Every process gets one multi-host DATABASE_URL with
`target_session_attrs=read-write` (`arm-core migrate` too): libpq connects to whichever
host takes writes. `arm-core serve` (the API) and two `arm-core bridge`s run against it,
an uploader adds a batch of files every few milliseconds through the same URL, and an
instant service acks and answers every request at once.

Mid-flow the primary is killed (every process of the cluster, kill -9: no shutdown
checkpoint, sockets reset, as when its machine dies). With no writable host left the API
answers a JSON 503 and /healthcheck says the database is unavailable; each process logs
the outage once. The standby is then promoted (`pg_ctl promote`, what Patroni or an
operator does) and everything carries on by itself: health back to ok, the bridges'
held answers applied, the uploads going on. At the end every job is done, each result
applied once (its message id, one result object per job, one "result applied" line
across both bridges' logs), and every upload the uploader saw committed is there.

With asynchronous replication (the standby not named in synchronous_standby_names) a
commit the primary acknowledged may never reach the standby: the same run then counts
what the failover lost. On loopback the standby is rarely behind, so that figure is
usually 0 here; the README says why production needs synchronous replication anyway."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from arm_core.devtools.testbed.faults import by_status, count, http_get
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, Stack, log_lines, running_stack
from arm_core.devtools.testbed.replication import Replicated, start_pair
from arm_core.devtools.testbed.services import instant_service
from arm_core.devtools.testbed.sql import dict_conn, ensure_logins, upload, upload_many
from arm_core.migrate import migrate

pytestmark = pytest.mark.e2e

BATCH = 5  # files per upload transaction
BATCH_EVERY = 0.02  # seconds between upload transactions
DONE_BEFORE_FAULT = 300


@pytest.fixture(params=[True, False], ids=["synchronous", "asynchronous"])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Replicated]:
    servers = start_pair(tmp_path, synchronous=request.param)
    try:
        servers.primary.create_database("arm")
        with psycopg.connect(servers.primary.url(), autocommit=True) as conn:
            # The embedded server runs with synchronous_commit=off for speed: this
            # database runs as production does (its setting overrides the command line).
            conn.execute("ALTER DATABASE arm SET synchronous_commit = on")
        # Through the URL every process gets: migrate takes several hosts too.
        migrate(servers.url("arm"))
        ensure_logins(servers.url("arm"))
        yield servers
    finally:
        servers.destroy()


@pytest.fixture
def stack(pair: Replicated, tmp_path: Path) -> Iterator[Stack]:
    yield from running_stack(pair.url("arm"), tmp_path)


@dataclass
class Uploader:
    """Uploads BATCH files per transaction every BATCH_EVERY seconds through `url`, as
    an upload service would: a commit that returned is `committed`; one whose outcome it
    cannot know (the connection died during COMMIT) is `in_doubt`; a batch that failed
    before is simply tried again on a new connection."""

    url: str
    committed: int = 0
    in_doubt: int = 0
    failed: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        while not stop.is_set():
            try:
                if conn is None or conn.closed:
                    conn = await psycopg.AsyncConnection.connect(self.url, connect_timeout=2)
                await self._batch(conn)
            except psycopg.OperationalError:
                self.failed += 1
                if conn is not None:
                    await conn.close()
                conn = None
                await asyncio.sleep(0.2)
            await asyncio.sleep(BATCH_EVERY)
        if conn is not None:
            await conn.close()

    async def _batch(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await conn.execute(
            """
            WITH o AS (
                INSERT INTO arm.s3_object (bucket, key, bucket_role)
                SELECT 'arm-ka', 'uploads/failover/' || gen_random_uuid(), 'uploads'
                FROM generate_series(1, %(n)s)
                RETURNING id, key
            ), f AS (
                INSERT INTO arm.stored_file (original_name, file_type, s3_object_id)
                SELECT 'ОСВ.xlsx', 'XLSX', o.id FROM o RETURNING id
            )
            INSERT INTO arm.recognition_job (file_id, attempt) SELECT id, 1 FROM f
            """,
            {"n": BATCH},
        )
        await conn.execute(
            """
            UPDATE arm.stored_file f SET current_recognition_job_id = j.id
            FROM arm.recognition_job j
            WHERE j.file_id = f.id AND f.current_recognition_job_id IS NULL
            """
        )
        try:
            await conn.commit()
        except psycopg.OperationalError:
            self.in_doubt += BATCH
            raise
        self.committed += BATCH


def not_done(url: str) -> set[str]:
    """The ids of the jobs that are not done."""
    with dict_conn(url) as conn:
        rows = conn.execute("SELECT id FROM arm.recognition_job WHERE status <> 'done'")
        return {str(r["id"]) for r in rows.fetchall()}


def answered(bridges: list[ArmProcess]) -> set[str]:
    """The ids of the jobs whose result a bridge logged as applied (DEBUG)."""
    return {
        line.split(" job_id=")[1].split()[0]
        for bridge in bridges
        for line in log_lines(bridge.log(), action="result")
        if "result applied" in line
    }


def outage_lines(proc: ArmProcess) -> list[str]:
    return log_lines(proc.log(), action="db_outage")


UPLOADED_BEFORE = 201


async def flow_with_failover(pair: Replicated, stack: Stack) -> tuple[Uploader, float]:
    """serve, two bridges and the uploader against the pair; the primary killed once
    DONE_BEFORE_FAULT jobs are done, the API and health checked while no host takes
    writes, the standby promoted, and the flow carried on until 100 more batches went
    in. Returns the uploader and the seconds from the kill until health was ok again."""
    url = pair.url("arm")
    with dict_conn(url) as conn:
        known = upload(conn)
        upload_many(conn, UPLOADED_BEFORE - 1)
    # DEBUG: a log line per result applied. ACK_TIMEOUT_SECONDS as in production: every
    # request is acked at once, none is republished for a slow machine.
    env = {"DATABASE_POOL_TIMEOUT_SECONDS": 2, "ACK_TIMEOUT_SECONDS": 30}
    # Each logs in with the roles its command needs (arm_core.devtools.testbed.processes).
    _, api = stack.serve(NATS_ENABLED="false", **env)
    for _ in range(2):
        stack.bridge(DEBUG="true", **env)
    uploader = Uploader(url)
    stop = asyncio.Event()
    flow = asyncio.create_task(uploader.run(stop))
    try:
        await wait_for(
            lambda: (
                count(url, "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'")
                >= DONE_BEFORE_FAULT
            ),
            60,
            lambda: f"{DONE_BEFORE_FAULT} jobs done before the fault; {by_status(url)}",
        )
        committed_at_fault = uploader.committed
        await asyncio.to_thread(pair.primary.kill)
        killed = time.monotonic()
        # No host takes writes: the API answers 503 JSON, health says why.
        await wait_for(
            lambda: http_get(f"{api}/healthcheck")[0] == 503, 30, "health: database down"
        )
        _, health = await asyncio.to_thread(http_get, f"{api}/healthcheck")
        assert health["db"].startswith("unavailable"), health
        status, body = await asyncio.to_thread(http_get, f"{api}/api/v1/files/{known.file_id}")
        assert status == 503 and body["error"]["code"] == "DATABASE_UNAVAILABLE", body
        await asyncio.sleep(1)  # the flow goes on meanwhile: answers held, uploads retried
        await asyncio.to_thread(pair.standby.promote)
        await wait_for(
            lambda: http_get(f"{api}/healthcheck")[1]["db"] == "ok", 60, "health back to ok"
        )
        recovered = time.monotonic() - killed
        await wait_for(
            lambda: uploader.committed >= committed_at_fault + 100 * BATCH,
            60,
            lambda: f"uploads go on after the failover: {uploader}",
        )
    finally:
        stop.set()
        await flow
    return uploader, recovered


async def test_failover_to_the_standby_loses_nothing(pair: Replicated, stack: Stack) -> None:
    synchronous = pair.synchronous
    url = pair.url("arm")
    # The service listens before anything is published: a request nobody heard would
    # wait for its republish (ACK_TIMEOUT_SECONDS) and blur the figures.
    service = await instant_service(stack.nats.url())
    try:
        uploader, recovered = await flow_with_failover(pair, stack)
        uploaded = UPLOADED_BEFORE + uploader.committed
        bridges = [p for p in stack.procs if p.command == "bridge"]
        await wait_for(
            lambda: not_done(url) <= (set() if synchronous else answered(bridges)),
            180,
            lambda: f"every job done (or its answer lost); by status: {by_status(url)}",
        )
    finally:
        await service.client.close()
    # Asynchronous: an answer the old primary applied (a bridge logged it and acked the
    # message) that never reached the standby leaves its job `processing` there, waiting
    # for its reply deadline: lost by the failover, counted.
    answers_lost = len(not_done(url))
    assert not (synchronous and answers_lost)
    with dict_conn(url) as conn:
        row = conn.execute(
            """
            SELECT count(*) AS jobs,
                   count(*) FILTER (WHERE result_msg_id = 'result:' || id || ':1') AS msg_ids,
                   count(*) FILTER (WHERE attempt = 1) AS first_attempts,
                   count(DISTINCT result_s3_object_id) AS objects,
                   (SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results') AS results,
                   (SELECT count(*) FROM arm.stored_file) AS files
            FROM arm.recognition_job
            """
        ).fetchone()
    assert row is not None
    jobs = row["jobs"]
    lost = max(uploaded - jobs, 0)
    print(
        f"\nfailover ({'synchronous' if synchronous else 'asynchronous'} standby): "
        f"{jobs} jobs, uploads committed {uploaded} (+{uploader.in_doubt} in doubt, "
        f"{uploader.failed} batches retried), lost {lost} uploads and {answers_lost} "
        f"answers, health back {recovered:.1f} s after the kill"
    )
    if synchronous:
        assert lost == 0, (uploaded, jobs)
    assert uploaded - lost <= jobs <= uploaded + uploader.in_doubt
    # Each answer applied once: its message id, one result object per job, no orphan.
    answered_jobs = jobs - answers_lost
    assert row == {
        "jobs": jobs,
        "msg_ids": answered_jobs,
        "first_attempts": jobs,
        "objects": answered_jobs,
        "results": answered_jobs,
        "files": jobs,
    }
    applied = Counter(
        line.split(" job_id=")[1].split()[0]
        for bridge in bridges
        for line in log_lines(bridge.log(), action="result")
        if "result applied" in line
    )
    if synchronous:
        # Asynchronous: a result applied on the old primary and never replicated is
        # applied again after the failover (its job went back to published, was
        # republished, answered again): the database above still holds it once.
        assert applied and set(applied.values()) == {1}, applied.most_common(3)
    for proc in stack.procs:
        assert proc.proc.poll() is None, proc.log()[-3000:]
        # The outage logged as one event: started once, ended once, no line per attempt.
        lines = outage_lines(proc)
        started = [line for line in lines if "state=started" in line]
        ended = [line for line in lines if "state=ended" in line]
        assert len(started) == len(ended) >= 1, lines
        assert len(lines) <= 3 * len(started), lines
        assert "error connecting" not in proc.log(), proc.log()[-3000:]
