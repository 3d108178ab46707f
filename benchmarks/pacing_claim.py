"""The paced claim's cost against its backlog: `arm.publish_queued_jobs_v3` as the
publisher sends it (src/arm_core/queries.sql `publish_paced_jobs`, PACING=fixed, room
for a whole batch), claiming BATCH jobs of the tabular pipeline:

(a) with 1,000 jobs queued in one consolidation (the reference);
(b) with 100,000 queued in one consolidation;
(c) with 100,000 queued across 1,000 consolidations of 100 each (round robin: the batch
    is one job from each of BATCH lanes).

Each claim runs in a transaction rolled back afterwards (so every repetition claims the
same jobs), REPEAT times; the figure is the median time, and the buffers its statements
touched (auto_explain: shared blocks hit + read of the outermost statement, which
counts every statement the functions ran under it). O(batch), not O(backlog): (b) and
(c) cost about what (a) does.
"""

from __future__ import annotations

import statistics
import time
import uuid

from arm_core.config import Settings
from arm_core.db import query
from arm_core.devtools.testbed.plans import buffers, explained
from arm_core.devtools.testbed.sql import upload_consolidations
from arm_core.store import Pacing, publish_params
from benchmarks.harness import Bench, connect, progress
from benchmarks.report import Report

SECTION = "11 paced claim"
BATCH = Settings().outbox_batch_size  # what a bridge claims at once
REPEAT = 7
UPLOAD_CHUNK = 10_000
# The tabular pipeline's room holds a whole batch (PACING=fixed, ceiling 10 batches).
PARAMS = publish_params(
    limit=BATCH,
    tabular_timeout=600,
    image_timeout=1800,
    tabular_subject="files.tabular_uploaded",
    image_subject="files.img_uploaded",
    max_bytes=1 << 20,
    pacing=Pacing(
        pacing="fixed",
        tabular_min=1,
        tabular_max=10 * BATCH,
        image_min=1,
        image_max=10 * BATCH,
        ack_timeout=30.0,
        max_republish=3,
    ),
)


def backlog(url: str, n: int, lanes: int) -> None:
    """n queued tabular jobs, spread evenly over `lanes` consolidations, through
    arm.upload_files in chunks; then VACUUM ANALYZE, as autovacuum would have by then."""
    consolidations = [uuid.uuid4() for _ in range(lanes)]
    with connect(url) as conn:
        for first in range(0, n, UPLOAD_CHUNK):
            upload_consolidations(conn, min(UPLOAD_CHUNK, n - first), consolidations, first)
        conn.execute("VACUUM ANALYZE")


def claim_cost(url: str) -> tuple[float, int, int]:
    """Median seconds of one claim, the buffers it touched, and the jobs it claimed."""
    times: list[float] = []
    with connect(url) as conn:
        for _ in range(REPEAT):
            with conn.transaction(force_rollback=True):
                began = time.perf_counter()
                claimed = len(conn.execute(query("publish_paced_jobs"), PARAMS).fetchall())
                times.append(time.perf_counter() - began)
    _, plans = explained(url, query("publish_paced_jobs"), PARAMS)
    return statistics.median(times), buffers(plans[-1]), claimed


def measured(bench: Bench, name: str, n: int, lanes: int) -> tuple[float, int, int]:
    url = bench.fresh_database(f"claim_{name}")
    progress(f"paced claim: {n:,} queued across {lanes:,} consolidation(s)")
    backlog(url, n, lanes)
    cost = claim_cost(url)
    bench.drop_database(url)
    return cost


def run(bench: Bench, report: Report) -> None:
    shapes = (("small", 1_000, 1), ("one", 100_000, 1), ("many", 100_000, 1_000))
    costs = {name: measured(bench, name, n, lanes) for name, n, lanes in shapes}
    for (name, n, lanes), ref in zip(shapes, (None, "claim.small", "claim.small"), strict=True):
        seconds, blocks, claimed = costs[name]
        where = f"{lanes:,} consolidation" + ("s" if lanes > 1 else "")
        report.add(
            f"claim.{name}",
            SECTION,
            f"paced claim of {BATCH} (claimed {claimed}), {n:,} queued across {where}: median time",
            1000 * seconds,
            "ms",
            ref=ref,
            digits=1,
            short=f"{n:,} queued, {where}",
        )
        report.add(
            f"claim.{name}.buffers",
            SECTION,
            "  the same: buffers its statements touched (hit + read, auto_explain)",
            blocks,
            "blocks",
            ref=None if ref is None else f"{ref}.buffers",
            short=f"buffers, {n:,} across {where}",
        )
