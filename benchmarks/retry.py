"""Retry API: `arm-core serve` (NATS_ENABLED=false) answering
POST /api/v1/files/{id}/retry once for each of N distinct failed files, 32 requests in
flight (an aiohttp client in this process); requests/s over the whole run, latency
percentiles per request, and the answers by status code. Failed files come through the functions:
uploads, arm.claim_queued_jobs + arm.mark_published with a deadline of now, then
arm.sweep_timeouts() (attempt 1 of 3 timed out, so each file may be retried)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import aiohttp

from arm_core.devtools.embedded import free_port
from benchmarks.harness import Bench, connect
from benchmarks.report import Report
from benchmarks.uploads import publish_in_sql, upload_files

SECTION = "8 retry API"


def _failed_files(url: str, n: int) -> list[uuid.UUID]:
    with connect(url) as conn:
        upload_files(conn, n, "retry")
        publish_in_sql(conn, timeout_seconds=0)
        conn.execute("SELECT arm.sweep_timeouts()")
        conn.execute("VACUUM ANALYZE")
        rows = conn.execute("SELECT id FROM arm.stored_file WHERE status = 'ERROR'").fetchall()
    return [r[0] for r in rows]


async def run(bench: Bench, report: Report) -> None:
    s = bench.sizes
    url = bench.fresh_database("retry")
    files = await asyncio.to_thread(_failed_files, url, s.retry_files)
    port = free_port()
    env = {
        "DATABASE_URL": url,
        "NATS_ENABLED": "false",
        "HTTP_HOST": "127.0.0.1",
        "HTTP_PORT": str(port),
    }
    with bench.arm_core("serve", env, port) as serve:
        meter = bench.cpu_meter(serve=serve.proc.pid).start()
        latencies, statuses, seconds = await _hammer(
            f"http://127.0.0.1:{port}", files, s.retry_concurrency
        )
        meter.stop()
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    report.add(
        "retry.rate",
        SECTION,
        f"POST /files/{{id}}/retry, {len(files):,} distinct failed files, "
        f"concurrency {s.retry_concurrency}",
        len(files) / seconds,
        "req/s",
        ref="pgbench",
    )
    answers = " · ".join(f"{code}: {n:,}" for code, n in sorted(statuses.items()))
    report.add(
        "retry.latency",
        SECTION,
        "    latency p50 · p99 · answers",
        text=f"{p50:,.1f} ms · {p99:,.1f} ms · {answers}",
    )
    report.add(
        "retry.cpu",
        SECTION,
        "    CPU, % of one core (bench = the aiohttp client; 2 cores = 200%)",
        text=meter.describe(),
    )
    bench.drop_database(url)


async def _hammer(
    base: str, files: list[uuid.UUID], concurrency: int
) -> tuple[list[float], Counter[int], float]:
    """Every file retried once, `concurrency` requests in flight at any time."""
    pending = iter(files)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            for file_id in pending:
                started = time.perf_counter()
                async with session.post(f"{base}/api/v1/files/{file_id}/retry") as resp:
                    await resp.read()
                    statuses[resp.status] += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return latencies, statuses, seconds
