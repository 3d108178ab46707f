"""Lifecycle: uploads → done through a real `arm-core bridge`, with an instant
recognition service in this process.

The service subscribes to both request subjects and answers every request at once with
an ack (`processing`, Nats-Msg-Id `ack:<job_id>:<attempt>`) and a result (`done`,
`result:<job_id>:<attempt>`) on files.tabular_parsed, shaped as
docs/contracts/examples/result-processing.json and result-done.json.

(a) a burst of uploads in one transaction, files/s until every job is done (or nothing
    has moved for STALL_SECONDS, longer than the ack timeout, so a republish had its
    chance), with the final states and the envelopes the bridge says it dropped;
(b) uploads paced at half of that rate for a few seconds, then enqueue→published and
    enqueue→done percentiles computed in SQL from requested_at, published_at and
    finished_at (requested_at is the upload transaction's start).
"""

from __future__ import annotations

import asyncio
import datetime
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks.cpu import CpuMeter
from benchmarks.harness import (
    Bench,
    connect,
    describe_counts,
    dropped_envelopes,
    scalar,
    status_counts,
)
from benchmarks.report import Report
from benchmarks.uploads import upload_files, upload_files_async
from tests.support.bridge import instant_service

SECTION = "6 lifecycle"
STALL_SECONDS = 45.0  # > ACK_TIMEOUT_SECONDS (30): a lost ack gets its republish first
POLL_SECONDS = 0.5
UPLOAD_CONNECTIONS = 2
LIVE = "status IN ('queued', 'published', 'processing')"


@dataclass
class Burst:
    files: int
    done: int
    seconds: float
    counts: dict[str, int]
    dropped: int
    cpu: str

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


async def run(bench: Bench, report: Report) -> None:
    url = bench.fresh_database("lifecycle")
    service = await instant_service(bench.nats_url)  # the tests' instant service
    client = service.client
    try:
        async with bench.bridge(url, ACK_TIMEOUT_SECONDS="30") as proc:
            meter = bench.cpu_meter(bridge=proc.proc.pid)
            burst = await _burst(url, bench.sizes.burst_files, meter)
            burst.dropped = dropped_envelopes(proc.log())
            _report_burst(report, burst)
            if burst.rate > 0:
                await _latency(url, burst.rate / 2, bench.sizes.latency_seconds, report)
            report.note(
                f"Lifecycle: the instant service received {service.answered:,} requests; "
                f"the bridge logged {dropped_envelopes(proc.log()):,} dropped envelopes "
                "over the whole section."
            )
    finally:
        await client.close()
    bench.drop_database(url)


async def _burst(url: str, n: int, meter: CpuMeter) -> Burst:
    with connect(url) as conn:
        await asyncio.to_thread(upload_files, conn, n, "burst")
    committed = time.time()
    meter.start()
    await _wait_settled(url, "true")
    meter.stop()
    last = await asyncio.to_thread(
        scalar,
        url,
        "SELECT coalesce(extract(epoch FROM max(finished_at)), 0)::float8 "
        "FROM arm.recognition_job WHERE status = 'done'",
    )
    counts = await asyncio.to_thread(status_counts, url)
    return Burst(n, counts.get("done", 0), max(last - committed, 0.0), counts, 0, meter.describe())


async def _wait_settled(url: str, where: str) -> None:
    """Until no job (matching `where`) is live, or nothing changed for STALL_SECONDS."""
    last_change = time.monotonic()
    previous = -1
    while True:
        live, final = await asyncio.to_thread(
            scalar,
            url,
            f"SELECT ARRAY[count(*) FILTER (WHERE {LIVE}), count(*) FILTER (WHERE NOT ({LIVE}))]"
            f" FROM arm.recognition_job WHERE {where}",
        )
        if live == 0:
            return
        if final != previous:
            previous, last_change = final, time.monotonic()
        elif time.monotonic() - last_change > STALL_SECONDS:
            return
        await asyncio.sleep(POLL_SECONDS)


def _report_burst(report: Report, b: Burst) -> None:
    report.add(
        "lifecycle.burst",
        SECTION,
        f"(a) burst of {b.files:,} uploads (one transaction) → done, files/s",
        b.rate,
        "files/s",
        ref="pgbench",
    )
    report.add(
        "lifecycle.states",
        SECTION,
        "    final states · envelopes the bridge dropped (its log)",
        text=f"{describe_counts(b.counts, ('done', 'processing', 'published'))} · "
        f"dropped {b.dropped:,}",
    )
    report.add(
        "lifecycle.cpu",
        SECTION,
        "    CPU during (a), % of one core (bench = the instant service; 2 cores = 200%)",
        text=b.cpu,
    )


async def _latency(url: str, rate: float, seconds: float, report: Report) -> None:
    started_at: datetime.datetime = await asyncio.to_thread(scalar, url, "SELECT clock_timestamp()")
    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True)
        for _ in range(UPLOAD_CONNECTIONS)
    ]
    try:
        sent = await asyncio.gather(
            *(_paced(c, rate / len(conns), seconds, f"paced{i}") for i, c in enumerate(conns))
        )
    finally:
        for c in conns:
            await c.close()
    where = f"requested_at >= '{started_at.isoformat()}'::timestamptz"
    await _wait_settled(url, where)
    with connect(url) as conn:
        row = conn.execute(
            f"""
            SELECT count(*),
                   count(*) FILTER (WHERE status = 'done'),
                   1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY
                       extract(epoch FROM published_at - requested_at)),
                   1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY
                       extract(epoch FROM published_at - requested_at)),
                   1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY
                       extract(epoch FROM finished_at - requested_at))
                       FILTER (WHERE status = 'done'),
                   1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY
                       extract(epoch FROM finished_at - requested_at))
                       FILTER (WHERE status = 'done')
            FROM arm.recognition_job WHERE {where}
            """
        ).fetchone()
    assert row is not None
    total, done, pub50, pub99, done50, done99 = row
    achieved = sum(sent) / seconds
    load = (
        f"(b) {sum(sent):,} uploads paced at {achieved:,.0f} files/s for {seconds:.0f} s "
        f"(target: half of (a), {rate:,.0f}/s; {UPLOAD_CONNECTIONS} connections, small batches)"
    )
    report.add("lifecycle.paced", SECTION, load, text=f"{done:,} of {total:,} done")
    report.add(
        "lifecycle.published",
        SECTION,
        "    enqueue → published, p50 · p99",
        text=f"{_ms(pub50)} · {_ms(pub99)}",
    )
    report.add(
        "lifecycle.done",
        SECTION,
        "    enqueue → done, p50 · p99",
        text=f"{_ms(done50)} · {_ms(done99)}",
    )


async def _paced(conn: psycopg.AsyncConnection[Any], rate: float, seconds: float, tag: str) -> int:
    """Uploads at `rate` files/s for `seconds`: each transaction carries the files that
    are due by then (one when the pace allows, a few when it falls behind)."""
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate) + 1 - sent
        if due > 0:
            await upload_files_async(conn, due, f"{tag}-{sent}")
            sent += due
        else:
            await asyncio.sleep(max((sent / rate) - elapsed, 0.001))
    return sent


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} ms"
