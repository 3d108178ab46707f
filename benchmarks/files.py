"""The file list, GET /api/v1/files: one page (50 files, the API's default; 51 asked, as
the API asks, to know whether there is a next page) of `arm.list_files` through the named
query the API sends, at 10,000 and at 1,000,000 files. It should cost the same at both
sizes for the first page, a page deep in the list (after a cursor), and a file status
filter; the ratio column says whether it does.

Files are plain-SQL uploads (benchmarks/uploads.py: an object, a file named "ОСВ n.xlsx"
or "Скан n.pdf", a queued job), loaded in batches of 100,000 and VACUUM ANALYZEd as
autovacuum would. One file in a hundred is then marked ERROR directly (with the table's
triggers off: the guard is not what is measured) so the status filter has a rare value to
find. `q` is measured twice: a common substring (half of the files match) and a rare one
(the name of one file in each batch of 100,000): the first walks the list and stops after
a page like the rest; the second is found through the trigram index of migration 0006
(pg_trgm, GIN on arm.fold_name(original_name)): its cost follows the few matches, not the
table. It is measured a second time with arm.list_files_q_cap = 0, which keeps q on the
walk: what a database without pg_trgm does (it reads every name, so that figure grows
with the table).

Each figure: the median of REPEATS calls, timed at the client on loopback.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from arm_core.db import query
from arm_core.rows import FileListFilter
from arm_core.store import file_list_params
from benchmarks.harness import Bench, connect, median, progress
from benchmarks.report import Report
from benchmarks.uploads import upload_files

SECTION = "9 file list"
REPEATS = 15
PAGE = 51  # the API's default limit (50) plus one
BATCH = 100_000

NO_FILTER = file_list_params(PAGE, FileListFilter())  # every file: the filters given override


def run(bench: Bench, report: Report) -> None:
    small, large = bench.sizes.file_list
    url = bench.fresh_database("files")
    label = {small: _size(small), large: _size(large)}
    with connect(url) as conn:
        loaded = 0
        for n in (small, large):
            progress(f"files: uploading {n - loaded:,} files (to {n:,})")
            while loaded < n:
                batch = min(BATCH, n - loaded)
                upload_files(conn, batch, f"list{loaded}")
                loaded += batch
            _mark_errors(conn)
            for table in ("arm.stored_file", "arm.recognition_job", "arm.s3_object"):
                conn.execute(f"VACUUM ANALYZE {table}")
            progress(f"files: measuring at {n:,} files")
            figures = _measure(conn, n)
            ref = None if n == small else small
            for key, (what, ms, rows) in figures.items():
                report.add(
                    f"files.{key}.{label[n]}",
                    SECTION,
                    f"{what}, {n:,} files ({rows} returned)",
                    ms,
                    "ms",
                    ref=None if ref is None else f"files.{key}.{label[ref]}",
                    digits=2,
                    short=f"{what}, {n:,} files",
                )
    report.note(
        "File list: one page of arm.list_files (51 rows asked) through the API's named "
        f"query, median of {REPEATS}; about 1 % of the files ERROR; the rare q matches one "
        "file a batch of 100,000 and is found through the pg_trgm index of migration 0006 "
        "(the same q walking the list, as without pg_trgm, reads every name and grows with "
        "the table)."
    )
    bench.drop_database(url)


def _size(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1_000}k"


def _mark_errors(conn: psycopg.Connection[Any]) -> None:
    """Every hundredth file not yet marked becomes ERROR, spread over the whole list."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(
            "UPDATE arm.stored_file SET status = 'ERROR' "
            "WHERE status = 'UPLOADED' AND get_byte(uuid_send(id), 15) < 3"
        )


def _page(conn: psycopg.Connection[Any], **filters: Any) -> list[Any]:
    return conn.execute(query("list_files"), {**NO_FILTER, **filters, "limit": PAGE}).fetchall()


def _timed(conn: psycopg.Connection[Any], **filters: Any) -> tuple[float, int]:
    timings = []
    rows: list[Any] = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        rows = _page(conn, **filters)
        timings.append((time.perf_counter() - started) * 1000)
    return median(timings), len(rows)


def _measure(conn: psycopg.Connection[Any], n: int) -> dict[str, tuple[str, float, int]]:
    # A keyset 5,000 files down the list: a page deep in it (the API's cursor).
    row = conn.execute(
        "SELECT created_at, id FROM arm.stored_file ORDER BY created_at DESC, id DESC "
        "OFFSET 5000 LIMIT 1"
    ).fetchone()
    assert row is not None
    deep = {"after_created_at": row[0], "after_id": row[1]}
    rare_name = conn.execute(
        "SELECT original_name FROM arm.stored_file ORDER BY created_at, id LIMIT 1"
    ).fetchone()
    assert rare_name is not None
    return {
        "first": ("first page, no filter", *_timed(conn)),
        "deep": ("a page 5,000 files down", *_timed(conn, **deep)),
        "error": ("status=ERROR (about 1 % of files)", *_timed(conn, statuses=["ERROR"])),
        "q_common": ("q matching half the files", *_timed(conn, q="осв")),
        "q_rare": ("q matching one name a batch", *_timed(conn, q=rare_name[0].upper())),
        "q_rare_walk": (
            "the same q walking the list (as without pg_trgm)",
            *_walking(conn, q=rare_name[0].upper()),
        ),
    }


def _walking(conn: psycopg.Connection[Any], **filters: Any) -> tuple[float, int]:
    """_timed with the trigram index's strategy off (arm.list_files_q_cap = 0)."""
    conn.execute("SELECT set_config('arm.list_files_q_cap', '0', false)")
    try:
        return _timed(conn, **filters)
    finally:
        conn.execute("RESET arm.list_files_q_cap")
