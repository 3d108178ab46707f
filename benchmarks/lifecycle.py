"""Lifecycle: uploads → done through a real `arm-core bridge` (PACING=off), with an
instant recognition service in this process.

The service subscribes to both request subjects and answers every request at once with
an ack (`processing`, Nats-Msg-Id `ack:<job_id>:<attempt>`) and a result (`done`,
`result:<job_id>:<attempt>`) on files.tabular_parsed, shaped as
docs/contracts/examples/result-processing.json and result-done.json.

(a) a burst of uploads in one transaction, files/s until every job is done (or nothing
    has moved for STALL_SECONDS, longer than the ack timeout, so a republish had its
    chance), with the final states and the envelopes the bridge says it dropped;
(b) uploads paced at half of that rate for a few seconds, then enqueue→published and
    enqueue→done percentiles. Enqueued is the moment the upload's COMMIT returned (the
    client's wall clock, kept per job; the server's published_at — the publisher's claim
    — and finished_at are on the same machine's clock): no publisher can see a job
    earlier. The same percentiles from requested_at (the upload transaction's start,
    what this section reported before) add the upload's own duration;
(c) the same at a quarter of (a)'s rate: at half, the paced uploads (small transactions,
    dearer per file than the burst's one), the bridge and PostgreSQL keep both cores
    busy, and the latency is mostly queueing for a CPU. CPU is measured for each.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from arm_core.devtools.testbed.faults import by_status
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.services import instant_service
from benchmarks.cpu import CpuMeter
from benchmarks.harness import (
    Bench,
    connect,
    describe_counts,
    dropped_envelopes,
    scalar,
)
from benchmarks.report import Report
from benchmarks.uploads import upload_files, upload_files_async

SECTION = "6 lifecycle"
STALL_SECONDS = 45.0  # > ACK_TIMEOUT_SECONDS (30): a lost ack gets its republish first
POLL_SECONDS = 0.5
UPLOAD_CONNECTIONS = 2
# The paced runs after the burst: at half its rate (the target), and at a quarter
# (headroom on this 2-core machine: at half, uploads, bridge and PostgreSQL use ~all of it).
PACED = (("b", 2), ("c", 4))
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
    service = await instant_service(bench.nats_url)  # the testbed's instant service
    client = service.client
    try:
        # Unpaced: what the machinery carries (capacity.md's figures); against an instant
        # service pacing only adds its slow start (the publish section's paced drain).
        async with bench.bridge(url, ACK_TIMEOUT_SECONDS="30", PACING="off") as proc:
            meter = bench.cpu_meter(bridge=proc.proc.pid)
            burst = await _burst(url, bench.sizes.burst_files, meter)
            burst.dropped = dropped_envelopes(proc.log())
            _report_burst(report, burst)
            if burst.rate > 0:
                for label, share in PACED:
                    paced = Paced(label, share, burst.rate / share, bench.sizes.latency_seconds)
                    await _latency(url, paced, report, meter)
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
    counts = await asyncio.to_thread(by_status, url)
    return Burst(n, counts.get("done", 0), max(last - committed, 0.0), counts, 0, meter.describe())


async def _wait_settled(url: str, where: str) -> None:
    """Until no job (matching `where`) is live, or nothing changed for STALL_SECONDS: no
    deadline of its own, the stall ends it."""
    previous, last_change = -1, time.monotonic()

    async def settled() -> bool:
        nonlocal previous, last_change
        live, final = await asyncio.to_thread(
            scalar,
            url,
            f"SELECT ARRAY[count(*) FILTER (WHERE {LIVE}), count(*) FILTER (WHERE NOT ({LIVE}))]"
            f" FROM arm.recognition_job WHERE {where}",
        )
        if live == 0:
            return True
        if final != previous:
            previous, last_change = final, time.monotonic()
            return False
        return time.monotonic() - last_change > STALL_SECONDS

    await wait_for(settled, math.inf, every=POLL_SECONDS)


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


@dataclass(frozen=True)
class Paced:
    """One paced run: uploads at `rate` (the burst's rate ÷ `share`) for `seconds`."""

    label: str
    share: int
    rate: float
    seconds: float


async def _latency(url: str, paced: Paced, report: Report, meter: CpuMeter) -> None:
    rate, seconds = paced.rate, paced.seconds
    started_at: datetime.datetime = await asyncio.to_thread(scalar, url, "SELECT clock_timestamp()")
    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True)
        for _ in range(UPLOAD_CONNECTIONS)
    ]
    committed: list[tuple[uuid.UUID, datetime.datetime]] = []
    meter.start()
    try:
        sent = await asyncio.gather(
            *(
                _paced(c, rate / len(conns), seconds, f"paced{i}", committed)
                for i, c in enumerate(conns)
            )
        )
    finally:
        for c in conns:
            await c.close()
    where = f"requested_at >= '{started_at.isoformat()}'::timestamptz"
    await _wait_settled(url, where)
    meter.stop()
    with connect(url) as conn:
        row = conn.execute(
            f"""
            WITH c AS (
                SELECT * FROM unnest(%(jobs)s::uuid[], %(ats)s::timestamptz[])
                    AS c(job_id, committed_at)
            ), j AS (
                SELECT j.status,
                       1000 * extract(epoch FROM j.published_at - j.requested_at) AS pub_tx,
                       1000 * extract(epoch FROM j.finished_at - j.requested_at) AS done_tx,
                       1000 * extract(epoch FROM j.published_at - c.committed_at) AS pub,
                       1000 * extract(epoch FROM j.finished_at - c.committed_at) AS done
                FROM arm.recognition_job j LEFT JOIN c ON c.job_id = j.id
                WHERE {where}
            )
            SELECT count(*),
                   count(*) FILTER (WHERE status = 'done'),
                   count(pub),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY pub),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY pub),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY done)
                       FILTER (WHERE status = 'done'),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY done)
                       FILTER (WHERE status = 'done'),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY pub_tx),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY pub_tx),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY done_tx)
                       FILTER (WHERE status = 'done'),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY done_tx)
                       FILTER (WHERE status = 'done')
            FROM j
            """,
            {"jobs": [j for j, _ in committed], "ats": [a for _, a in committed]},
        ).fetchone()
    assert row is not None
    total, done, timed, pub50, pub99, done50, done99, pubtx50, pubtx99, donetx50, donetx99 = row
    assert timed == total == sum(sent), (timed, total, sum(sent))
    achieved = sum(sent) / seconds
    p, key = paced, f"lifecycle.paced{paced.share}"
    load = (
        f"({p.label}) {sum(sent):,} uploads paced at {achieved:,.0f} files/s for {seconds:.0f} s "
        f"(target: 1/{p.share} of (a), {rate:,.0f}/s; {UPLOAD_CONNECTIONS} connections, "
        "small batches)"
    )
    report.add(key, SECTION, load, text=f"{done:,} of {total:,} done")
    report.add(
        f"{key}.cpu",
        SECTION,
        "    CPU, % of one core, from the first upload until every job is final",
        text=meter.describe(),
    )
    report.add(
        f"{key}.published",
        SECTION,
        "    enqueue (the upload's COMMIT returned) → published, p50 · p99",
        text=f"{_ms(pub50)} · {_ms(pub99)}",
    )
    report.add(
        f"{key}.done",
        SECTION,
        "    enqueue (the upload's COMMIT returned) → done, p50 · p99",
        text=f"{_ms(done50)} · {_ms(done99)}",
    )
    report.add(
        f"{key}.from_start",
        SECTION,
        "    from the upload transaction's start: → published · → done, p50 · p99",
        text=f"{_ms(pubtx50)} · {_ms(pubtx99)}; {_ms(donetx50)} · {_ms(donetx99)}",
    )


async def _paced(
    conn: psycopg.AsyncConnection[Any],
    rate: float,
    seconds: float,
    tag: str,
    committed: list[tuple[uuid.UUID, datetime.datetime]],
) -> int:
    """Uploads at `rate` files/s for `seconds`: each transaction carries the files that
    are due by then (one when the pace allows, a few when it falls behind). Appends each
    job with the moment its upload's COMMIT returned to `committed` (the wall clock the
    server's timestamps use: same machine)."""
    started = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        due = int(elapsed * rate) + 1 - sent
        if due > 0:
            jobs = await upload_files_async(conn, due, f"{tag}-{sent}")
            at = datetime.datetime.now(datetime.UTC)
            committed += [(job, at) for job in jobs]
            sent += due
        else:
            await asyncio.sleep(max((sent / rate) - elapsed, 0.001))
    return sent


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f} ms"
