"""Through PgBouncer: what a transaction pooler in front of the bridge's pool costs a
job's way out, beside the same bridge connected directly, in one run.

A real PgBouncer (Debian's `pgbouncer`, run with docs/pgbouncer.ini as
tests/e2e/test_pgbouncer.py runs it: transaction mode) in front of the run's PostgreSQL.
For each way in, a fresh database and one `arm-core bridge` (PACING=off): direct
(DATABASE_URL to PostgreSQL), then through PgBouncer (DATABASE_URL to PgBouncer,
DATABASE_POOLER=transaction, DATABASE_LISTEN_URL direct: its LISTEN, as docs/dbas.md
says). An instant service in this process (the testbed's) acks and answers every request
at once.

(a) Into an idle exchange, one upload at a time, the next once the last is done:
    upload → published and upload → done, p50 · p95. The upload's moment is when its
    COMMIT returned (this process's clock; published_at and finished_at are the
    server's, on the same machine). OUTBOX_POLL_SECONDS is a minute, so each job goes
    out on its NOTIFY: the LISTEN session wakes the publisher, which claims, publishes,
    confirms and commits on a pooled connection.
(b) A burst in one transaction → every job done, files/s: the pool's connections under
    load, each transaction through PgBouncer.
"""

from __future__ import annotations

import asyncio
import datetime
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from arm_core.devtools.testbed.pgbouncer import running_pgbouncer
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.services import instant_service
from arm_core.devtools.testbed.sql import BRIDGE_LOGIN, as_login, ensure_logins
from benchmarks.harness import Bench, connect, scalar
from benchmarks.report import Report
from benchmarks.uploads import upload_files, upload_files_async

SECTION = "12 PgBouncer"
PASSWORD = "bench-Pw9xQ2vL7k"
POLL_SECONDS = "60"  # the fallback poll: each job of (a) goes out on its NOTIFY


@dataclass(frozen=True)
class Figures:
    way: str
    published: tuple[float, float]  # p50, p95, ms
    done: tuple[float, float]
    singles: int
    burst: int
    burst_rate: float  # files/s


async def run(bench: Bench, report: Report) -> None:
    assert bench.pg.port is not None
    singles = 20 if bench.sizes.latency_seconds < 10 else 100
    burst = bench.sizes.burst_files // 6
    with running_pgbouncer(bench.pg.port, {BRIDGE_LOGIN.name: PASSWORD}) as bouncer:
        direct = await _measure(bench, "direct", None, singles, burst)
        pooled = await _measure(bench, "pgbouncer", bouncer.url, singles, burst)
    for f in (direct, pooled):
        how = "direct" if f.way == "direct" else "through PgBouncer (transaction mode)"
        ref = None if f.way == "direct" else "pgbouncer.direct"
        report.add(
            f"pgbouncer.{f.way}",
            SECTION,
            f"(a) {f.singles} uploads one at a time into an idle exchange, {how}: → published p50",
            f.published[0],
            "ms",
            ref=ref,
            digits=1,
            short="direct",
        )
        report.add(
            f"pgbouncer.{f.way}.more",
            SECTION,
            "    → published p95 · → done p50 · p95",
            text=f"{f.published[1]:.1f} ms · {f.done[0]:.1f} ms · {f.done[1]:.1f} ms",
        )
        report.add(
            f"pgbouncer.{f.way}.burst",
            SECTION,
            f"(b) burst of {f.burst:,} uploads (one transaction) → done, {how}",
            f.burst_rate,
            "files/s",
            ref=None if f.way == "direct" else "pgbouncer.direct.burst",
            short="direct",
        )


async def _measure(
    bench: Bench, way: str, through: Callable[[str, str], str] | None, singles: int, burst: int
) -> Figures:
    """Both measures on a fresh database with a bridge of `way` (`through`: PgBouncer's
    url(dbname, login); None: direct)."""
    url = bench.fresh_database(f"pgbouncer_{way}")
    ensure_logins(url)
    env = {"PACING": "off", "ACK_TIMEOUT_SECONDS": "30", "OUTBOX_POLL_SECONDS": POLL_SECONDS}
    bridge_url = (
        url  # the bridge's login, as every bench bridge (arm_core.devtools.testbed.processes)
    )
    if through is not None:
        bridge_url = through(url.rsplit("/", 1)[1], BRIDGE_LOGIN.name)
        env |= {
            "DATABASE_POOLER": "transaction",
            "DATABASE_LISTEN_URL": as_login(url, BRIDGE_LOGIN),
        }
    service = await instant_service(bench.nats_url)
    try:
        async with bench.bridge(bridge_url, **env):
            published, done = await _one_at_a_time(url, singles)
            rate = await _burst(url, burst)
    finally:
        await service.client.close()
    bench.drop_database(url)
    return Figures(way, published, done, singles, burst, rate)


async def _one_at_a_time(url: str, n: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """`n` uploads, each once the one before is done; → published and → done, p50 and
    p95 in ms."""
    committed: list[tuple[uuid.UUID, datetime.datetime]] = []
    async with (
        await psycopg.AsyncConnection.connect(url, autocommit=True) as conn,
        await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher,
    ):
        for i in range(n):
            [job] = await upload_files_async(conn, 1, f"single-{i}")
            committed.append((job, datetime.datetime.now(datetime.UTC)))

            async def done(job: uuid.UUID = job) -> bool:
                cur = await watcher.execute(
                    "SELECT status = 'done' FROM arm.recognition_job WHERE id = %s", (job,)
                )
                row = await cur.fetchone()
                return bool(row and row[0])

            await wait_for(done, 30, f"upload {i} done", every=0.02)
    with connect(url) as reader:
        row = reader.execute(
            """
            WITH c AS (SELECT * FROM unnest(%(jobs)s::uuid[], %(ats)s::timestamptz[])
                           AS c(job_id, committed_at)),
                 j AS (SELECT 1000 * extract(epoch FROM j.published_at - c.committed_at) AS pub,
                              1000 * extract(epoch FROM j.finished_at - c.committed_at) AS done
                       FROM arm.recognition_job j JOIN c ON c.job_id = j.id)
            SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY pub),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY pub),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY done),
                   percentile_cont(0.95) WITHIN GROUP (ORDER BY done)
            FROM j
            """,
            {"jobs": [j for j, _ in committed], "ats": [a for _, a in committed]},
        ).fetchone()
    assert row is not None
    return (float(row[0]), float(row[1])), (float(row[2]), float(row[3]))


async def _burst(url: str, n: int) -> float:
    """`n` uploads in one transaction → the last done, files/s (the server's clock)."""
    with connect(url) as conn:
        await asyncio.to_thread(upload_files, conn, n, "burst")
    committed = time.time()

    async def all_done() -> bool:
        left = await asyncio.to_thread(
            scalar, url, "SELECT count(*) FROM arm.recognition_job WHERE status <> 'done'"
        )
        return int(left) == 0

    await wait_for(all_done, max(120.0, n / 50), f"the burst of {n:,} done", every=0.25)
    last = await asyncio.to_thread(
        scalar, url, "SELECT extract(epoch FROM max(finished_at))::float8 FROM arm.recognition_job"
    )
    return n / max(float(last) - committed, 1e-9)
