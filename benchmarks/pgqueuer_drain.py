"""A reference queue: how fast PgQueuer (with asyncpg, its fastest driver) drains a
backlog on the same cluster, in its own database.

As PgQueuer documents it: the schema comes from its Queries API (`Queries.install()`,
what `pgq install` runs); the jobs are enqueued in one batch call; one QueueManager on a
dedicated asyncpg connection (its docs: "use a direct asyncpg connection for the
QueueManager") runs a no-op entrypoint with a larger `batch_size` than the default 10
(its tuning guide: raise it for short jobs) in `drain` mode, which returns once the
queue is empty. jobs/s = N ÷ the time `run()` took.

And the enqueue: PgQueuer's one batch call of N jobs (jobs/s = N ÷ the time `enqueue`
took), beside arm-core's bulk import of the same N files in one call of
`arm.upload_files` (docs/dbas.md "Uploading a file") as the upload service's role
(arm_test_uploader, member of arm_uploader only), in a migrated database of its own:
one JSON array of N files (XLSX and PDF alternately, a fresh key and consolidation id
each), built before the clock starts; files/s = N ÷ the time from sending the statement
to having its N rows of ids back (it commits on its own: autocommit). Each arm-core file
is three rows (an object, a file, a queued job, with the upload's triggers), a PgQueuer
job one.
"""

from __future__ import annotations

import json
import time
import uuid

import psycopg

from arm_core.devtools.testbed.sql import UPLOADER_LOGIN, as_login, ensure_logins
from benchmarks.harness import Bench, progress
from benchmarks.report import Report

KEY = "pgqueuer"
BATCH_SIZE = 100
SECTION = "4 PgQueuer"


async def run(bench: Bench, report: Report) -> None:
    n = bench.sizes.pgqueuer_jobs
    try:
        import asyncpg
        from pgqueuer import Job, QueueManager
        from pgqueuer.db import AsyncpgDriver
        from pgqueuer.queries import Queries
        from pgqueuer.types import QueueExecutionMode
    except ImportError as exc:
        report.add(KEY, SECTION, "PgQueuer drain", text=f"skipped: {exc}")
        report.note(
            "PgQueuer row skipped: pgqueuer/asyncpg not importable "
            "(`make bench` installs the `bench` extra: pip install -e '.[bench]')."
        )
        upload_batch(bench, report, n)
        return

    url = bench.fresh_database("pgqueuer", migrated=False)
    setup = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(setup))
        await queries.install()
        started = time.perf_counter()
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
        enqueued = time.perf_counter() - started
    finally:
        await setup.close()

    conn = await asyncpg.connect(url)
    done = 0
    try:
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("noop")
        async def noop(job: Job) -> None:
            nonlocal done
            done += 1

        started = time.perf_counter()
        await qm.run(batch_size=BATCH_SIZE, mode=QueueExecutionMode.drain)
        elapsed = time.perf_counter() - started
    finally:
        await conn.close()
    import pgqueuer

    report.add(
        KEY,
        SECTION,
        f"PgQueuer {pgqueuer.__version__} drain, {n:,} jobs, 1 QueueManager, asyncpg, "
        f"batch_size {BATCH_SIZE}",
        done / elapsed,
        "jobs/s",
        ref="pgbench",
        short=f"PgQueuer drain {n:,}",
    )
    if done != n:
        report.note(f"PgQueuer ran {done:,} of {n:,} jobs before its drain run returned.")
    bench.drop_database(url)
    report.add(
        f"{KEY}.enqueue",
        SECTION,
        f"PgQueuer {pgqueuer.__version__} enqueue, {n:,} jobs in one call, asyncpg",
        n / enqueued,
        "jobs/s",
        short=f"PgQueuer enqueue {n:,}",
    )
    upload_batch(bench, report, n)


def upload_batch(bench: Bench, report: Report, n: int) -> None:
    """arm.upload_files of n files in one call, as the uploader's login."""
    url = bench.fresh_database("uploads_batch")
    ensure_logins(url)
    files = json.dumps(
        [
            {
                "bucket": "arm-ka",
                "key": f"uploads/import/{uuid.uuid4()}/{name}",
                "original_name": name,
                "file_type": "XLSX" if i % 2 else "PDF",
                "consolidation_id": str(uuid.uuid4()),
                "created_by": "import",
            }
            for i in range(1, n + 1)
            for name in [f"ОСВ {i}.xlsx" if i % 2 else f"Скан {i}.pdf"]
        ],
        ensure_ascii=False,
    )
    progress(f"arm.upload_files, {n:,} files in one call")
    with psycopg.connect(as_login(url, UPLOADER_LOGIN), autocommit=True) as conn:
        started = time.perf_counter()
        rows = conn.execute("SELECT * FROM arm.upload_files(%s::jsonb)", (files,)).fetchall()
        elapsed = time.perf_counter() - started
    report.add(
        "uploads.batch",
        SECTION,
        f"arm.upload_files, {n:,} files in one call (docs/dbas.md), role arm_uploader, "
        f"{len(files.encode()) / 1e6:.1f} MB of JSON",
        len(rows) / elapsed,
        "files/s",
        ref=f"{KEY}.enqueue",
        short=f"arm.upload_files {n:,}",
    )
    bench.drop_database(url)
