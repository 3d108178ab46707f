"""WAL bytes per file: what one upload and the processing of one file write to the
write-ahead log, read as `pg_current_wal_insert_lsn()` after − before, ÷ the files, on a
quiet cluster (nothing else runs in it; autovacuum is off for the tables of `arm` in this
database, so its passes do not land in the window). A CHECKPOINT opens each window, so
each figure includes the full-page image that the first change of a page after a
checkpoint costs (with full_page_writes on), as production pays after each of its
checkpoints. Read the FPI share as this database's: the upload window starts on empty
tables (a new page needs no image), and in 10,000 files each page takes many changes per
checkpoint to share its image; a large table's random-UUID index pages take few, so there
the images weigh more per file.

Upload: the uploads section's pgbench script (docs/dbas.md's four statements, one
transaction per file), N transactions from 1 client as `arm_test_uploader` (member of
`arm_uploader`).

Processing: in SQL, through the functions the bridge calls, with its default batch sizes
(src/arm_core/config.py) and no NATS: `arm.publish_queued_jobs_v2` (src/arm_core/queries.sql,
as the publisher sends it), OUTBOX_BATCH_SIZE (500) jobs per transaction, then
for each published job an ack (`processing`) and a result (`done`, with result_s3 and
the metrics of docs/contracts/examples/result-done.json) as the service sends them, in
order, INBOX_BATCH_SIZE (500) envelopes per `arm.apply_envelopes_v2` call (one
transaction, as the inbox batches them), and one `arm.compact_counts()` at the end (the
bridge folds the count deltas every 5 s; this folds the upload's and the processing's).
All as `arm_test_bridge` (member of `arm_bridge`). The bridge's other ticks (the
schedule each second, the ack-timeout checks) are not per file and are left out.

Breakdown: `pg_waldump --stats` between the same two LSNs (the cluster's pg_wal): the
record bytes of each resource manager per file (Heap, Btree, Gin, …, largest first) and
the full-page images of all of them as `FPI`; they add up to a little less than the LSN
difference (page headers and padding). Left out, with the reason, when pg_waldump fails.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from arm_core.config import Settings
from arm_core.db import query
from arm_core.devtools.embedded_postgres import find_pg_bindir
from arm_core.devtools.testbed.polling import NotWithin, wait_for_sync
from arm_core.devtools.testbed.sql import BRIDGE_LOGIN, UPLOADER_LOGIN, as_login, ensure_logins
from benchmarks.harness import Bench, connect, progress, scalar
from benchmarks.pgbench import run_pgbench
from benchmarks.report import Report
from benchmarks.upload_scaling import pgbench_base, pgbench_env, upload_script

SECTION = "3 WAL"
PUBLISH_BATCH = Settings().outbox_batch_size  # the bridge's defaults (src/arm_core/config.py)
INBOX_BATCH = Settings().inbox_batch_size
MAX_BYTES = 1 << 20  # nats-server's default max_payload
METRICS = {"rows": 412, "duration_ms": 1830}  # docs/contracts/examples/result-done.json
# A pg_waldump --stats line: name, N (%), record size (%), FPI size (%), combined (%).
_STATS_LINE = re.compile(
    r"^(\S+)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)"
)


@dataclass
class Window:
    start: str
    end: str
    bytes: int
    breakdown: str


def run(bench: Bench, report: Report) -> None:
    n = bench.sizes.wal_files
    url = bench.fresh_database("wal")
    ensure_logins(url)
    _autovacuum_off(url)

    progress(f"WAL of {n:,} uploads (1 client, one transaction each)")
    script = upload_script(bench)
    base = pgbench_base(bench, UPLOADER_LOGIN.name)
    cmd = [*base, "-n", "-f", str(script), "-c", "1", "-j", "1", "-t", str(n)]
    upload = _window(
        bench, url, n, lambda: run_pgbench([*cmd, "-M", "extended", "wal"], pgbench_env())
    )
    files = int(scalar(url, "SELECT count(*) FROM arm.stored_file"))
    if files != n:
        raise RuntimeError(f"{files:,} files after {n:,} uploads")

    progress(f"WAL of processing {n:,} files (publish, ack, result) through the functions")
    processing = _window(bench, url, n, lambda: _process(as_login(url, BRIDGE_LOGIN), n))
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT status::text, count(*) FROM arm.recognition_job GROUP BY 1"
        ).fetchall()
    counts = {status: int(count) for status, count in rows}
    if counts != {"done": n}:
        raise RuntimeError(f"after processing: {counts}")

    for key, what, w, ref in (
        ("wal.upload", f"upload (4 statements, 1 transaction), {n:,} files", upload, None),
        ("wal.processing", "processing: publish, ack, result", processing, "wal.upload"),
    ):
        report.add(
            key,
            SECTION,
            f"WAL bytes per file, {what}",
            w.bytes / n,
            "B",
            ref=ref,
            short="WAL per upload",
        )
        report.add(
            f"{key}.by_rmgr",
            SECTION,
            "    per file by resource manager (pg_waldump --stats)",
            text=w.breakdown,
        )
    report.note(
        f"WAL: {n:,} files; upload window {upload.start}–{upload.end} "
        f"({upload.bytes:,} B), processing window {processing.start}–{processing.end} "
        f"({processing.bytes:,} B); each window opened by a CHECKPOINT."
    )
    bench.drop_database(url)


def _autovacuum_off(url: str) -> None:
    with connect(url) as conn:
        tables = conn.execute(
            "SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname = 'arm'"
        ).fetchall()
        for (table,) in tables:
            conn.execute(
                f"ALTER TABLE {table} SET (autovacuum_enabled = off, "
                "toast.autovacuum_enabled = off)"
            )


def _lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def _window(bench: Bench, url: str, n: int, work: Callable[[], object]) -> Window:
    """CHECKPOINT, the insert LSN, `work()`, the insert LSN again; then, once the WAL up
    to there is on disk, pg_waldump --stats over that range."""
    with connect(url) as conn:
        conn.execute("CHECKPOINT")
        start = _lsn(conn)
        work()
        end = _lsn(conn)
        row = conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)
        ).fetchone()
        assert row is not None
        size = int(row[0])

        def flushed() -> bool:
            got = conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (end,)).fetchone()
            return bool(got and got[0])

        # With synchronous_commit off, the WAL writer's lag. Not flushed by then: the
        # breakdown says why pg_waldump could not read it.
        with contextlib.suppress(NotWithin):
            wait_for_sync(flushed, 10, f"the WAL flushed up to {end}", every=0.1)
    return Window(start, end, size, _breakdown(bench, start, end, n))


def _breakdown(bench: Bench, start: str, end: str, n: int) -> str:
    """`Heap 410 B · Btree 380 B · … · FPI 1,200 B` per file, or why there is none."""
    cmd = [
        str(find_pg_bindir() / "pg_waldump"),
        "--path",
        str(bench.pg.data_dir / "pg_wal"),
        "--start",
        start,
        "--end",
        end,
        "--stats",
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no breakdown: {type(exc).__name__}: {exc}"[:200]
    rows = [m.groups() for line in done.stdout.splitlines() if (m := _STATS_LINE.match(line))]
    if done.returncode != 0 or not rows:
        why = done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}"
        return f"no breakdown: pg_waldump: {why.splitlines()[-1][:160]}"
    records = sorted(
        ((name, int(rec)) for name, _, rec, _, _ in rows if int(rec)), key=lambda r: -r[1]
    )
    fpi = sum(int(f) for _, _, _, f, _ in rows)
    parts = [f"{name} {rec / n:,.0f} B" for name, rec in records if rec / n >= 0.5]
    return " · ".join([*parts, f"FPI {fpi / n:,.0f} B"])


def _process(url: str, n: int) -> None:
    """Publishes every queued job, PUBLISH_BATCH per transaction, and applies an ack and a result
    for each, INBOX_BATCH envelopes per apply_envelopes_v2 call; then folds the count deltas."""
    processed = 0
    with psycopg.connect(url) as conn:  # autocommit off: one transaction per call
        while True:
            published = conn.execute(
                query("publish_queued_jobs"),
                {
                    "limit": PUBLISH_BATCH,
                    "tabular_timeout": 600,
                    "image_timeout": 1800,
                    "tabular_subject": "files.tabular_uploaded",
                    "image_subject": "files.img_uploaded",
                    "max_bytes": MAX_BYTES,
                },
            ).fetchall()
            conn.commit()
            if not published:
                break
            envelopes: list[dict[str, Any]] = []
            for job_id, attempt, file_id, outcome, *_ in published:
                if outcome != "published":
                    raise RuntimeError(f"job {job_id}: {outcome}")
                envelopes += [_ack(job_id, file_id, attempt), _done(job_id, file_id, attempt)]
            for i in range(0, len(envelopes), INBOX_BATCH):
                batch = envelopes[i : i + INBOX_BATCH]
                outcomes = conn.execute(
                    query("apply_envelopes"),
                    {"envelopes": Jsonb(batch, dumps=_dumps)},
                ).fetchall()
                conn.commit()
                bad = [o for o in outcomes if o[1] != "applied"]
                if bad:
                    raise RuntimeError(f"apply_envelopes_v2: {bad[:3]}")
            processed += len(published)
        conn.execute(query("compact_counts"))
        conn.commit()
    if processed != n:
        raise RuntimeError(f"published {processed:,} of {n:,}")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _ack(job_id: Any, file_id: Any, attempt: int) -> dict[str, Any]:
    return {
        "job_id": str(job_id),
        "file_id": str(file_id),
        "msg_id": f"ack:{job_id}:{attempt}",
        "status": "processing",
        "service_name": "tabular-parser",
        "service_version": "1.4.2",
        "result_bucket": None,
        "result_key": None,
        "result_schema_version": None,
        "error_code": None,
        "error_message": None,
        "metrics": None,
    }


def _done(job_id: Any, file_id: Any, attempt: int) -> dict[str, Any]:
    return {
        **_ack(job_id, file_id, attempt),
        "msg_id": f"result:{job_id}:{attempt}",
        "status": "done",
        "result_bucket": "arm-ka",
        "result_key": f"results/{file_id}/{job_id}/result.json",
        "result_schema_version": "1.0",
        "metrics": METRICS,
    }
