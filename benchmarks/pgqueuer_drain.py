"""A reference queue: how fast PgQueuer (with asyncpg, its fastest driver) drains a
backlog on the same cluster, in its own database.

As PgQueuer documents it: the schema comes from its Queries API (`Queries.install()`,
what `pgq install` runs); the jobs are enqueued in one batch call; one QueueManager on a
dedicated asyncpg connection (its docs: "use a direct asyncpg connection for the
QueueManager") runs a no-op entrypoint with a larger `batch_size` than the default 10
(its tuning guide: raise it for short jobs) in `drain` mode, which returns once the
queue is empty. jobs/s = N ÷ the time `run()` took.
"""

from __future__ import annotations

import time

from benchmarks.harness import Bench
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
        return

    url = bench.fresh_database("pgqueuer", migrated=False)
    setup = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(setup))
        await queries.install()
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
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
