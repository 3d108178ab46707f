"""The soak's sampler (benchmarks/soak.py, `make soak`) on a short run: the soak itself
runs for an hour outside `make test`, and its verdict on a series of rows is unit-tested
(tests/unit/test_soak_verdict.py); this checks that a row read from a live world holds
what the verdict judges — the window's jobs and latencies, every process's RSS, the
connections, the tables, the live queues' indexes and the stream."""

from __future__ import annotations

import time
from pathlib import Path

import psycopg
import pytest

from arm_core.devtools.testbed import nemesis
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.sql import upload_many
from benchmarks import soak

pytestmark = pytest.mark.e2e

DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"


async def test_a_sample_of_a_live_world_holds_every_figure_the_soak_judges(
    tmp_path: Path,
) -> None:
    world = nemesis.World(tmp_path)
    try:
        await world.start()
        began = time.monotonic()
        with psycopg.connect(world.db_url, autocommit=True) as conn:
            upload_many(conn, 60, mixed=True)
        await wait_for(lambda: nemesis.scalar(world.db_url, DONE) == 60, 120, "60 jobs done")
        record = soak.Soak(minutes=1)
        row = await soak.sampled(world, record, began, began)
    finally:
        await world.stop()
    print(soak.format_row(row))
    assert row.jobs_done == 60
    assert row.p50 is not None and row.p99 is not None and 0 < row.p50 <= row.p99
    # Every process of the world, and each one's series kept for the RSS verdict.
    assert len(row.rss_mib) == len(record.rss_by_pid) >= 4
    assert all(mib > 10 for mib in row.rss_mib.values()), row.rss_mib
    assert row.connections > 0
    assert set(row.tables) == set(soak.TABLES)
    assert all(size > 0 for size, _dead in row.tables.values())
    assert set(row.indexes) == set(soak.QUEUE_INDEXES)
    assert row.stream_bytes is not None
