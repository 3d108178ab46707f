"""`python -m benchmarks.growth [--files N]`: what history costs on disk, per million files,
and whether the hot paths feel the archive.

Growth: a fresh database gets N finished files (default 200,000) bulk-loaded as the sweep
benchmark builds its history (benchmarks/sweep.py: a file, its source object, one final
job — nine in ten done, with a result object — and every CHECK and foreign key holding),
then VACUUM ANALYZE, as autovacuum would. Each table's heap (with its TOAST) and each
index is measured with pg_relation_size and given per million files (bytes are linear in
rows: the loaded rows are what a real history holds, but for the names). The same is
done for the archive's tables after arm.archive_files has moved every file there.

The archive's weight on the hot paths: with 1,000 live jobs (uploaded, published an hour
ahead, every other one acked) and BATCH queued ones, three statements are timed — the
timeout sweep with 10 due jobs, the publisher's claim of 10 queued jobs (each rolled
back) and the file list's first page (51 rows, the API's query) — first with no history
at all, then after N history files were loaded and archived: the median of several runs,
and the rows of the hot tables each statement read. The sweep, the claim and the list
should not feel the archived volume.

Runs at production durability (fsync, synchronous_commit and full_page_writes on); writes
docs/growth.md."""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from arm_core.db import query
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.migrate import migrate
from benchmarks import sweep
from benchmarks.files import NO_FILTER, PAGE
from benchmarks.harness import connect, median, progress
from benchmarks.report import machine, server_settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "growth.md"
HOT = ("stored_file", "recognition_job", "s3_object", "retry_audit")
ARCHIVE = ("archived_file", "archived_job", "archived_retry_audit")
REPEATS = 7
LIVE = 1_000

SIZES = """
SELECT c.relname, pg_relation_size(c.oid) + coalesce(pg_total_relation_size(c.reltoastrelid), 0),
       (SELECT coalesce(json_agg(json_build_array(i.relname, pg_relation_size(i.oid))
                                 ORDER BY i.relname), '[]')
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid WHERE x.indrelid = c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'arm' AND c.relname = ANY(%s)
ORDER BY c.relname
"""


def sizes(
    conn: psycopg.Connection[Any], tables: tuple[str, ...]
) -> list[tuple[str, int, list[Any]]]:
    for table in tables:
        conn.execute(f"VACUUM ANALYZE arm.{table}")
    return [(r[0], int(r[1]), list(r[2])) for r in conn.execute(SIZES, (list(tables),))]


def per_million(n: int, value: int) -> str:
    return f"{value * 1_000_000 / n / (1 << 20):,.0f} MiB"


def size_table(title: str, n: int, measured: list[tuple[str, int, list[Any]]]) -> list[str]:
    """A markdown section: each table's heap and indexes, per million of its `n` files."""
    lines = [f"## {title}", "", "| table or index | per million files |", "| --- | ---: |"]
    total = 0
    for table, heap, indexes in measured:
        lines.append(f"| `{table}` (heap) | {per_million(n, heap)} |")
        total += heap
        for name, size in indexes:
            lines.append(f"| ↳ `{name}` | {per_million(n, size)} |")
            total += size
    return [*lines, f"| **all** | **{per_million(n, total)}** |", ""]


def timed(conn: psycopg.Connection[Any]) -> dict[str, tuple[float, int]]:
    """The sweep, the claim and the file list's first page: median ms, rows read."""
    out: dict[str, tuple[float, int]] = {}
    swept = sweep._measure(conn, 10, REPEATS)
    out["timeout sweep, 10 due of 1,000 live"] = (swept.ms, swept.rows_read)
    _, claim = sweep._batches(conn, REPEATS)
    out["publisher's claim of 10 queued jobs"] = (claim.ms, claim.rows_read)
    timings, rows = [], 0
    for _ in range(REPEATS):
        with conn.transaction():
            before = sweep._rows_read(conn)
            started = time.perf_counter()
            page = conn.execute(query("list_files"), {**NO_FILTER, "limit": PAGE}).fetchall()
            timings.append((time.perf_counter() - started) * 1000)
            rows = sweep._rows_read(conn) - before
        assert len(page) == PAGE
    out["file list, first page (51 rows)"] = (median(timings), rows)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.growth", description=__doc__)
    parser.add_argument("--files", type=int, default=200_000, help="history files to load")
    args = parser.parse_args(argv)
    n = args.files
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="arm-growth-") as tmp:
        pg = EmbeddedPostgres(base_dir=Path(tmp) / "pg", durable=True)
        pg.start()
        try:
            settings = server_settings(pg.url())
            machine_lines = machine(settings)
            pg.create_database("growth")
            url = pg.url("growth")
            migrate(url)
            with connect(url) as conn:
                progress("growth: live jobs, the reference timings")
                sweep._add_live(conn, LIVE)
                before = timed(conn)
                progress(f"growth: {n:,} history files, bulk-loaded")
                sweep._bulk_history(conn, n)
                hot = sizes(conn, HOT)
                progress("growth: archiving them")
                started = time.perf_counter()
                moved = 0
                while True:
                    row = conn.execute(
                        "SELECT files FROM arm.archive_files(now() - interval '1 day', 50000)"
                    ).fetchone()
                    if not row or not row[0]:
                        break
                    moved += int(row[0])
                archive_seconds = time.perf_counter() - started
                cold = sizes(conn, ARCHIVE)
                after = timed(conn)
        finally:
            pg.destroy()
    lines = [
        "# Growth: what history costs, and the archive",
        "",
        "Written by `python -m benchmarks.growth` (overwritten); how it measures is at the end.",
        "",
        f"Command: `{shlex.join(['python', '-m', 'benchmarks.growth', *argv])}`; the whole "
        f"run took {time.perf_counter() - began:.0f} s.",
        "",
        "## Machine",
        "",
        *[f"- {line}" for line in machine_lines],
        "",
        *size_table(f"Per million files in the hot tables ({n:,} loaded)", n, hot),
        *size_table(
            f"Per million files in the archive ({moved:,} moved in {archive_seconds:.0f} s)",
            moved,
            cold,
        ),
        "The source and result objects (`arm.s3_object`) stay in the hot table: the archived "
        "rows name them, until a DBA deletes archived files for good with their objects "
        "(docs/dbas.md, Retiring old history).",
        "",
        f"## The hot paths, without history and with {moved:,} files archived",
        "",
        "| statement | no history: ms, rows read | archived: ms, rows read |",
        "| --- | ---: | ---: |",
    ]
    for what, (ms, rows) in before.items():
        ms2, rows2 = after[what]
        lines.append(f"| {what} | {ms:.2f} ms, {rows:,} | {ms2:.2f} ms, {rows2:,} |")
    lines += ["", "## How it measures", "", " ".join((__doc__ or "").split("\n\n")[1].split())]
    lines += ["", " ".join((__doc__ or "").split("\n\n")[2].split()), ""]
    DOC.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    print(f"written to {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
