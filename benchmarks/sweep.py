"""The timeout sweep: `SELECT arm.sweep_timeouts()` with a fixed number of due jobs among
growing numbers of live jobs and of history rows. It should cost what is due, not what
is stored.

Live jobs are built through the functions: plain-SQL uploads, then
arm.publish_queued_jobs_v2 in SQL (reply deadlines an hour away), then an ack for half of
them through arm.apply_envelopes_v2 (so they are published and processing). Small history is
built the same way and timed out by the sweep itself. Large history is bulk-loaded:
final rows (done, error, timeout) that satisfy every CHECK and foreign key, inserted
with the table's user triggers disabled (the guard and the upload defaults), then
enabled again. After each build the table is VACUUM ANALYZEd, as autovacuum would.

Each measurement: CHECKPOINT, then in a transaction move the deadline of `due` random
live jobs into the past (allowed while they are live), time the sweep statement (client
side, loopback), roll back; the median of several runs. The checkpoint first makes every
run alike: the first change of a page after a checkpoint writes the whole page to the
WAL (full_page_writes), and without it whether the sweep's pages were last changed
before or after the server's own latest checkpoint (the bulk load of the large history
sets one off) decided the figure.

With the smallest and the largest history, the two batch functions of the bridge are
timed the same way: the inbox's arm.apply_envelopes_v2 with acks for BATCH (10) random
published jobs, and the publisher's arm.publish_queued_jobs_v2 claiming BATCH queued jobs
(uploaded for it), each in a transaction rolled back, with the job and file rows it read.
Like the sweep, a batch should cost what it carries, not what is stored.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.harness import Bench, Sizes, connect, median, progress
from benchmarks.report import Report
from benchmarks.uploads import publish_in_sql, upload_files

SECTION = "7 sweep"
HOUR = 3600.0
BATCH = 10  # envelopes (acks) per inbox batch, jobs per publish claim


def run(bench: Bench, report: Report) -> None:
    s = bench.sizes
    (live_small, live_large), (hist_small, hist_large) = s.sweep_live, s.sweep_history
    url = bench.fresh_database("sweep")
    with connect(url) as conn:
        progress(f"sweep: {hist_small:,} history and {live_small:,} live jobs via the functions")
        _history_through_functions(conn, hist_small)
        _add_live(conn, live_small)
        base = _measure(conn, s.sweep_due, s.sweep_repeats)
        _row(report, "sweep.base", f"{live_small:,} live, {hist_small:,} history", base, s)
        small_where = f"{live_small:,} live, {hist_small:,} history"
        small_batches = _batches(conn, s.sweep_repeats)

        progress(f"sweep: {live_large - live_small:,} more live jobs via the functions")
        _add_live(conn, live_large - live_small)
        more_live = _measure(conn, s.sweep_due, s.sweep_repeats)
        _row(
            report,
            "sweep.live",
            f"{live_large:,} live, {hist_small:,} history",
            more_live,
            s,
            ref="sweep.base",
        )

        # Back to the small live set: the extra live jobs time out and become history;
        # the rest of the large history is bulk-loaded.
        progress(f"sweep: {live_large - live_small:,} live jobs time out into history")
        _time_out_newest(conn, live_large - live_small)
        history_now = _count(conn, "status NOT IN ('queued', 'published', 'processing')")
        progress(f"sweep: bulk-loading {hist_large - history_now:,} history rows")
        loaded = _bulk_history(conn, hist_large - history_now)
        progress("sweep: measuring")
        more_history = _measure(conn, s.sweep_due, s.sweep_repeats)
        live_now = _count(conn, "status IN ('published', 'processing')")
        history_now = _count(conn, "status NOT IN ('queued', 'published', 'processing')")
        _row(
            report,
            "sweep.history",
            f"{live_now:,} live, {history_now:,} history",
            more_history,
            s,
            ref="sweep.base",
        )
        # The guard: what the sweep touches, not its milliseconds, against 100 × history.
        for key, sweep, where in (
            ("sweep.touched.base", base, f"{live_small:,} live, {hist_small:,} history"),
            ("sweep.touched.history", more_history, f"{live_now:,} live, {history_now:,} history"),
        ):
            report.add(
                key,
                SECTION,
                f"    sweep_timeouts() among {where}: buffers it touched (hit + read), and "
                "rows read (guard ≤ 1.2×)",
                sweep.blocks_touched,
                "blocks",
                ref="sweep.touched.base" if key.endswith("history") else None,
                text=f"{sweep.blocks_touched or 0:,.0f} blocks · {sweep.rows_read:,} rows",
                short=f"touched among {where}",
            )

        large_where = f"{live_now:,} live, {history_now:,} history"
        large_batches = _batches(conn, s.sweep_repeats)
        for (key, what), small, large in zip(
            (
                ("inbox", f"apply_envelopes_v2(), {BATCH} acks"),
                ("claim", f"publish_queued_jobs_v2(), {BATCH} queued jobs claimed"),
            ),
            small_batches,
            large_batches,
            strict=True,
        ):
            _batch_row(report, f"sweep.{key}.base", what, small_where, small)
            _batch_row(
                report, f"sweep.{key}.history", what, large_where, large, f"sweep.{key}.base"
            )

        # The target: both large at once, against the large history alone.
        progress(f"sweep: {live_large - live_small:,} more live jobs again, with the history")
        _add_live(conn, live_large - live_small)
        both = _measure(conn, s.sweep_due, s.sweep_repeats)
        live_now = _count(conn, "status IN ('published', 'processing')")
        _row(
            report,
            "sweep.both",
            f"{live_now:,} live, {history_now:,} history",
            both,
            s,
            ref="sweep.history",
        )
    report.note(
        f"Sweep: {loaded:,} of the {hist_large:,} history rows were bulk-loaded (INSERT … "
        "SELECT with `ALTER TABLE arm.recognition_job DISABLE TRIGGER USER`, re-enabled "
        "after; every CHECK and foreign key held); the rest came through the functions. "
        f"Median of {s.sweep_repeats} runs, {s.sweep_due} due jobs re-created in a "
        "transaction that is rolled back each time."
    )
    bench.drop_database(url)


def _row(
    report: Report, key: str, where: str, sweep: Sweep, s: Sizes, ref: str | None = None
) -> None:
    report.add(
        key,
        SECTION,
        f"sweep_timeouts(), {s.sweep_due} due among {where}; "
        f"it read {sweep.rows_read:,} job+file rows ({sweep.blocks_read or 0:,.0f} blocks "
        f"from outside the buffer cache), wrote {(sweep.wal_bytes or 0) / 1024:,.0f} KiB of WAL",
        sweep.ms,
        "ms",
        ref=ref,
        digits=1,
        short=f"{s.sweep_due} due among {where}",
    )


def _batch_row(
    report: Report, key: str, what: str, where: str, batch: Sweep, ref: str | None = None
) -> None:
    report.add(
        key,
        SECTION,
        f"{what}, among {where}; it read {batch.rows_read:,} job+file rows",
        batch.ms,
        "ms",
        ref=ref,
        digits=2,
        short=f"{what}, among {where}",
    )


def _batches(conn: psycopg.Connection[Any], repeats: int) -> tuple[Sweep, Sweep]:
    """The inbox's batch and the publisher's claim of BATCH each, at the database's
    present size: median milliseconds over `repeats` rolled-back runs, rows read."""
    published = [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT id, file_id FROM arm.recognition_job WHERE status = 'published'"
        ).fetchall()
    ]
    upload_files(conn, BATCH, "claim")
    inbox, claim = [], []
    inbox_read = claim_read = 0
    for _ in range(repeats):
        acks = [
            {
                "job_id": str(job_id),
                "file_id": str(file_id),
                "msg_id": f"ack:{job_id}:1",
                "status": "processing",
                "service_name": "tabular-parser",
                "service_version": "1.4.2",
            }
            for job_id, file_id in random.sample(published, BATCH)
        ]
        ms, inbox_read = _rolled_back(
            conn, "SELECT count(*) FROM arm.apply_envelopes_v2(%s)", (Jsonb(acks),), BATCH
        )
        inbox.append(ms)
        ms, claim_read = _rolled_back(
            conn,
            "SELECT count(*) FROM arm.publish_queued_jobs_v2(%s, interval '1 hour', "
            "interval '1 hour', 'files.tabular_uploaded', 'files.img_uploaded', 1048576)",
            (BATCH,),
            BATCH,
        )
        claim.append(ms)
    # The claim's jobs stay queued: the next _add_live publishes them with the others.
    return Sweep(median(inbox), inbox_read), Sweep(median(claim), claim_read)


def _rolled_back(
    conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...], expect: int
) -> tuple[float, int]:
    """Milliseconds of `sql` (which returns how many rows it acted on: `expect`) in a
    transaction that is rolled back, and the job and file rows it read."""
    try:
        with conn.transaction():
            before = _rows_read(conn)
            started = time.perf_counter()
            row = conn.execute(sql, params).fetchone()
            ms = (time.perf_counter() - started) * 1000
            read = _rows_read(conn) - before
            if row is None or row[0] != expect:
                raise RuntimeError(f"{sql}: {row and row[0]} rows, not {expect}")
            raise psycopg.Rollback
    except psycopg.Rollback:
        pass
    return ms, read


def _count(conn: psycopg.Connection[Any], where: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM arm.recognition_job WHERE {where}").fetchone()
    return int(row[0]) if row else 0


def _vacuum(conn: psycopg.Connection[Any]) -> None:
    for table in ("arm.recognition_job", "arm.stored_file", "arm.s3_object"):
        conn.execute(f"VACUUM ANALYZE {table}")


def _add_live(conn: psycopg.Connection[Any], n: int) -> None:
    """`n` live jobs: uploaded, published an hour ahead, every other one acked."""
    upload_files(conn, n, "live")
    publish_in_sql(conn, timeout_seconds=HOUR)
    conn.execute(
        """
        SELECT count(*)
        FROM arm.apply_envelopes_v2((
            SELECT coalesce(jsonb_agg(jsonb_build_object(
                'job_id', j.id, 'file_id', j.file_id, 'msg_id', 'ack:' || j.id,
                'status', 'processing',
                'service_name', CASE j.pipeline WHEN 'tabular' THEN 'tabular-parser'
                                                ELSE 'scan-gateway' END,
                'service_version', '1.4.2')), '[]')
            FROM arm.recognition_job j
            WHERE j.status = 'published' AND j.started_at IS NULL
              AND get_byte(uuid_send(j.id), 15) % 2 = 0))
        """
    )
    _vacuum(conn)


def _history_through_functions(conn: psycopg.Connection[Any], n: int) -> None:
    """`n` timed-out jobs: uploaded, published with a deadline of now, swept."""
    upload_files(conn, n, "history")
    publish_in_sql(conn, timeout_seconds=0)
    conn.execute("SELECT arm.sweep_timeouts()")
    _vacuum(conn)


def _time_out_newest(conn: psycopg.Connection[Any], n: int) -> None:
    """The `n` newest live jobs pass their deadline and are swept into history."""
    conn.execute(
        """
        UPDATE arm.recognition_job SET reply_deadline = clock_timestamp() - interval '1 second'
        WHERE id IN (SELECT id FROM arm.recognition_job
                     WHERE status IN ('published', 'processing')
                     ORDER BY requested_at DESC LIMIT %s)
        """,
        (n,),
    )
    conn.execute("SELECT arm.sweep_timeouts()")


@dataclass
class Sweep:
    ms: float  # median
    rows_read: int  # job and file rows its scans returned (pg_stat_xact_user_tables)
    wal_bytes: float | None = None  # median WAL it wrote (full-page images included)
    blocks_read: float | None = None  # median blocks of arm it read from outside the cache
    blocks_touched: float | None = None  # median blocks of arm it touched: hit + read


def _measure(conn: psycopg.Connection[Any], due: int, repeats: int) -> Sweep:
    """Median milliseconds of the sweep with `due` overdue jobs among the live ones, and
    how many job rows it read to find them."""
    live = [
        r[0]
        for r in conn.execute(
            "SELECT id FROM arm.recognition_job WHERE status IN ('published', 'processing')"
        ).fetchall()
    ]
    timings: list[float] = []
    wal: list[float] = []
    blocks: list[float] = []
    touched: list[float] = []
    rows_read = 0
    for _ in range(repeats):
        chosen = random.sample(live, due)
        conn.execute("CHECKPOINT")
        try:
            with conn.transaction():
                conn.execute(
                    "UPDATE arm.recognition_job "
                    "SET reply_deadline = clock_timestamp() - interval '1 second' "
                    "WHERE id = ANY(%s)",
                    (chosen,),
                )
                before = _rows_read(conn)
                io_before = _io(conn)
                started = time.perf_counter()
                row = conn.execute("SELECT arm.sweep_timeouts()").fetchone()
                timings.append((time.perf_counter() - started) * 1000)
                io_after = _io(conn)
                rows_read = _rows_read(conn) - before
                wal.append(io_after[0] - io_before[0])
                blocks.append(io_after[1] - io_before[1])
                touched.append(io_after[2] - io_before[2])
                if row is None or row[0] != due:
                    raise RuntimeError(f"the sweep timed out {row and row[0]} jobs, not {due}")
                raise psycopg.Rollback
        except psycopg.Rollback:
            pass
    return Sweep(median(timings), rows_read, median(wal), median(blocks), median(touched))


def _io(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    """WAL inserted so far (bytes), and the blocks of arm's tables and indexes this
    transaction read from outside the buffer cache, and touched (hit + read), so far."""
    row = conn.execute(
        "SELECT pg_current_wal_insert_lsn() - '0/0', "
        "(SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid) - pg_stat_get_xact_blocks_hit(c.oid)) "
        " FROM pg_class c WHERE c.relnamespace = 'arm'::regnamespace), "
        "(SELECT sum(pg_stat_get_xact_blocks_fetched(c.oid)) "
        " FROM pg_class c WHERE c.relnamespace = 'arm'::regnamespace)"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1] or 0), int(row[2] or 0)


def _rows_read(conn: psycopg.Connection[Any]) -> int:
    """Rows of arm.recognition_job and arm.stored_file read so far in this transaction
    (index and sequential scans): what the sweep costs, whatever its plan."""
    row = conn.execute(
        "SELECT sum(coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0)) "
        "FROM pg_stat_xact_user_tables "
        "WHERE relid IN ('arm.recognition_job'::regclass, 'arm.stored_file'::regclass)"
    ).fetchone()
    return int(row[0] or 0) if row else 0


_BULK = """
CREATE TEMP TABLE bulk ON COMMIT DROP AS
SELECT g,
       arm.uuid_v7() AS obj_id, arm.uuid_v7() AS file_id,
       arm.uuid_v7() AS job_id, arm.uuid_v7() AS res_id,
       CASE WHEN g %% 10 = 0 THEN 'timeout' WHEN g %% 10 = 1 THEN 'error' ELSE 'done' END
           ::arm.job_status AS status,
       date_trunc('milliseconds', clock_timestamp() - interval '60 days' * random()) AS t
FROM generate_series(1, %(n)s) g;

INSERT INTO arm.s3_object (id, bucket, key, bucket_role, created_by, created_at)
SELECT obj_id, 'arm-ka', 'uploads/' || file_id || '/ОСВ ' || g || '.xlsx', 'uploads',
       'upload-service', t
FROM bulk;
INSERT INTO arm.s3_object (id, bucket, key, bucket_role, created_by, created_at)
SELECT res_id, 'arm-ka', 'results/' || file_id || '/' || job_id || '/result.json', 'results',
       'tabular-parser', t + interval '5 seconds'
FROM bulk WHERE status = 'done';
INSERT INTO arm.stored_file (id, consolidation_id, original_name, file_type, s3_object_id,
                             status, created_at, updated_at)
SELECT file_id, gen_random_uuid(), 'ОСВ ' || g || '.xlsx', 'XLSX', obj_id,
       CASE status WHEN 'done' THEN 'PROCESSING' ELSE 'ERROR' END::arm.file_status,
       t, t + interval '5 seconds'
FROM bulk;
INSERT INTO arm.recognition_job (
    id, file_id, pipeline, attempt, max_attempts, status, requested_at,
    published_at, request_msg_id, request_subject, reply_deadline, republish_count,
    last_published_at, started_at, finished_at, service_name, service_version,
    error_code, error_message, result_schema_version, result_s3_object_id, result_msg_id)
SELECT job_id, file_id, 'tabular', 1, 3, status, t,
       t + interval '1 second', job_id || ':1', 'files.tabular_uploaded',
       t + interval '601 seconds', 0, t + interval '1 second',
       CASE WHEN status <> 'timeout' THEN t + interval '2 seconds' END,
       CASE WHEN status = 'timeout' THEN t + interval '602 seconds'
            ELSE t + interval '5 seconds' END,
       CASE WHEN status <> 'timeout' THEN 'tabular-parser' END,
       CASE WHEN status <> 'timeout' THEN '1.4.2' END,
       CASE status WHEN 'error' THEN 'UNSUPPORTED_FORMAT' WHEN 'timeout' THEN 'TIMEOUT' END,
       CASE status WHEN 'error' THEN 'Формат не поддерживается'
                   WHEN 'timeout' THEN 'no result by reply_deadline' END,
       CASE WHEN status = 'done' THEN '1.0' END,
       CASE WHEN status = 'done' THEN res_id END,
       CASE WHEN status IN ('done', 'error') THEN 'result:' || job_id || ':1' END
FROM bulk;
UPDATE arm.stored_file f SET current_recognition_job_id = b.job_id
FROM bulk b WHERE f.id = b.file_id;
"""


def _bulk_history(conn: psycopg.Connection[Any], n: int) -> int:
    """Bulk-loads `n` final jobs (with their files and objects); returns `n`."""
    if n <= 0:
        return 0
    with conn.transaction():
        conn.execute("ALTER TABLE arm.recognition_job DISABLE TRIGGER USER")
        conn.execute("ALTER TABLE arm.stored_file DISABLE TRIGGER USER")
        for statement in _BULK.split(";\n"):
            if statement.strip():
                conn.execute(statement, {"n": n})
        conn.execute("ALTER TABLE arm.stored_file ENABLE TRIGGER USER")
        conn.execute("ALTER TABLE arm.recognition_job ENABLE TRIGGER USER")
    _vacuum(conn)
    return n
