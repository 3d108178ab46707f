"""Retry API: `arm-core serve` (NATS_ENABLED=false) answering
POST /api/v1/files/{id}/retry once for each of N distinct failed files, 32 requests in
flight (an aiohttp client in this process); requests/s over the whole run, latency
percentiles per request, and the answers by status code. The reference is the same
server answering GET /healthcheck N times, 32 in flight, from the same client just before:
a request that reads the database through the same pool (the oldest queued job's age) but
writes nothing, so the ratio is what a retry's transaction costs over the HTTP and pool
round trip every request pays. Failed files come through the functions:
uploads, arm.publish_queued_jobs_v2 with a deadline of now, then
arm.sweep_timeouts() (attempt 1 of 3 timed out, so each file may be retried).

Two guards on the same run: the retries' throughput at 32 in flight against `pgbench -N`
at 16 clients (the uploads section's, same cluster), and retries offered open-loop at a
fixed OPEN_RATE a second, each sent at its time whatever the answers before it did, on
other failed files: their p99, timed from when each was due (no coordinated omission),
against OPEN_P99_MS."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

import aiohttp

from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.processes import serve_env
from benchmarks.harness import Bench, connect
from benchmarks.report import Report
from benchmarks.uploads import publish_in_sql, upload_files

SECTION = "8 retry API"
OPEN_RATE = 100  # retries a second, offered open-loop
OPEN_SECONDS = 10
OPEN_P99_MS = 25.0


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
    failed = await asyncio.to_thread(_failed_files, url, s.retry_files + OPEN_RATE * OPEN_SECONDS)
    files, open_files = failed[: s.retry_files], failed[s.retry_files :]
    port = free_port()
    with bench.arm_core("serve", serve_env(url, port), port) as serve:
        base = f"http://127.0.0.1:{port}"
        health_latencies, health_statuses, health_seconds = await _hammer(
            [("GET", f"{base}/healthcheck")] * len(files), s.retry_concurrency
        )
        meter = bench.cpu_meter(serve=serve.proc.pid).start()
        latencies, statuses, seconds = await _hammer(
            [("POST", f"{base}/api/v1/files/{file_id}/retry") for file_id in files],
            s.retry_concurrency,
        )
        meter.stop()
        offered = await _offer(
            [f"{base}/api/v1/files/{file_id}/retry" for file_id in open_files], OPEN_RATE
        )
    health_latencies.sort()
    report.add(
        "retry.health",
        SECTION,
        f"GET /healthcheck (reads the database, writes nothing), {len(files):,} requests, "
        f"concurrency {s.retry_concurrency}",
        len(files) / health_seconds,
        "req/s",
    )
    report.add(
        "retry.health_latency",
        SECTION,
        "    latency p50 · p99 · answers",
        text=f"{_pct(health_latencies, 0.5):,.1f} ms · {_pct(health_latencies, 0.99):,.1f} ms"
        f" · {_answers(health_statuses)}",
    )
    latencies.sort()
    report.add(
        "retry.rate",
        SECTION,
        f"POST /files/{{id}}/retry, {len(files):,} distinct failed files, "
        f"concurrency {s.retry_concurrency}",
        len(files) / seconds,
        "req/s",
        ref="retry.health",
    )
    report.add(
        "retry.latency",
        SECTION,
        "    latency p50 · p99 · answers",
        text=f"{_pct(latencies, 0.5):,.1f} ms · {_pct(latencies, 0.99):,.1f} ms"
        f" · {_answers(statuses)}",
    )
    report.add(
        "retry.vs_pgbench",
        SECTION,
        "    the same retries/s against pgbench -N at 16 clients (guard ≥ 0.2)",
        len(files) / seconds,
        "req/s",
        ref="uploads.N16",
        short=f"retries/s at {s.retry_concurrency} in flight",
    )
    open_latencies, open_statuses = offered
    open_latencies.sort()
    report.add(
        "retry.open.bound",
        SECTION,
        "open-loop retries: the p99 they must stay under",
        OPEN_P99_MS,
        "ms",
        digits=1,
        short="the bound",
    )
    report.add(
        "retry.open",
        SECTION,
        f"POST /files/{{id}}/retry offered open-loop at {OPEN_RATE}/s for {OPEN_SECONDS} s "
        f"({len(open_latencies):,} files): p99 from when each was due",
        _pct(open_latencies, 0.99),
        "ms",
        ref="retry.open.bound",
        digits=1,
        text=f"{_pct(open_latencies, 0.99):,.1f} ms (p50 {_pct(open_latencies, 0.5):,.1f} ms;"
        f" {_answers(open_statuses)})",
    )
    report.add(
        "retry.cpu",
        SECTION,
        "    CPU, % of one core (bench = the aiohttp client; 2 cores = 200%)",
        text=meter.describe(),
    )
    bench.drop_database(url)


def _pct(sorted_seconds: list[float], q: float) -> float:
    """The q-quantile of sorted latencies, in ms."""
    return sorted_seconds[min(len(sorted_seconds) - 1, int(len(sorted_seconds) * q))] * 1000


def _answers(statuses: Counter[int]) -> str:
    return " · ".join(f"{code}: {n:,}" for code, n in sorted(statuses.items()))


async def _hammer(
    requests: list[tuple[str, str]], concurrency: int
) -> tuple[list[float], Counter[int], float]:
    """Every (method, url) requested once, `concurrency` requests in flight at any time."""
    pending = iter(requests)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            for method, url in pending:
                started = time.perf_counter()
                async with session.request(method, url) as resp:
                    await resp.read()
                    statuses[resp.status] += 1
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return latencies, statuses, seconds


async def _offer(urls: list[str], rate: float) -> tuple[list[float], Counter[int]]:
    """POSTs each of `urls` at its own time, `rate` a second from now, whatever the
    answers before it did; each latency from when the request was due."""
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(url: str, due: float) -> None:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            async with session.post(url) as resp:
                await resp.read()
                statuses[resp.status] += 1
            latencies.append(time.perf_counter() - due)

        start = time.perf_counter() + 0.1
        await asyncio.gather(*(one(url, start + i / rate) for i, url in enumerate(urls)))
    return latencies, statuses
