"""Benchmarks that print figures (`make bench`); no timed asserts anywhere.

publish: N queued jobs (plain SQL) → a bridge publishes them; prints the wall time,
messages per second and the transactions committed per thousand jobs (from
pg_stat_database), which shows the batching: a few per thousand, not one per job.
inbox: N acks + N results applied through NATS; prints envelopes per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import nats
import psycopg

from arm_core.embedded import EmbeddedNats, EmbeddedPostgres
from arm_core.migrate import migrate
from tests.bridge.support import collect, fast_settings, running_bridge, wait_for
from tests.sqlhelpers import upload_many


def commits(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        row = c.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def count(url: str, status: str) -> int:
    with psycopg.connect(url) as c:
        row = c.execute(
            "SELECT count(*) FROM arm.recognition_job WHERE status = %s", (status,)
        ).fetchone()
    assert row is not None
    return int(row[0])


async def bench_publish(url: str, nats_url: str, n: int, batch: int) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        upload_many(c, n)
    listener = await nats.connect(nats_url)
    seen = await collect(listener, "files.tabular_uploaded")
    settings = fast_settings(url, nats_url, outbox_batch_size=batch, schedule_tick_seconds=3600)
    before = commits(url)
    started = time.perf_counter()
    async with running_bridge(settings) as bridge:
        await wait_for(lambda: count(url, "published") == n, 600, "all published")
        elapsed = time.perf_counter() - started
        await wait_for(lambda: len(seen.messages) >= n, 60)
        batches = bridge.publisher.stats.batches
    # Polling count() commits too (one per poll); the bridge's own share is what is left.
    txns = commits(url) - before
    await listener.close()
    print(
        f"publish  jobs={n} batch={batch} seconds={elapsed:.2f} "
        f"msgs_per_s={n / elapsed:,.0f} publish_transactions={batches} commits_all={txns} "
        f"publish_transactions_per_1000_jobs={batches * 1000 / n:.1f} "
        f"received={len(seen.messages)} unique={len(set(seen.msg_ids()))}"
    )


async def bench_inbox(url: str, nats_url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as c:
        rows = c.execute(
            "SELECT id, file_id FROM arm.recognition_job WHERE status = 'published' LIMIT %s", (n,)
        ).fetchall()
    client = await nats.connect(nats_url)
    async with running_bridge(fast_settings(url, nats_url, schedule_tick_seconds=3600)) as bridge:
        started = time.perf_counter()
        for job_id, file_id in rows:
            body = {
                "schema_version": "1.0",
                "job_id": str(job_id),
                "file_id": str(file_id),
                "service": {"name": "tabular-parser", "version": "1"},
            }
            await client.publish(
                "files.tabular_parsed",
                json.dumps({**body, "status": "processing"}).encode(),
                headers={"Nats-Msg-Id": f"ack:{job_id}:1"},
            )
            result = {
                **body,
                "status": "done",
                "result_schema_version": "1.0",
                "result_s3": {"bucket": "arm-ka", "key": f"results/{file_id}/{job_id}/result.json"},
            }
            await client.publish(
                "files.tabular_parsed",
                json.dumps(result).encode(),
                headers={"Nats-Msg-Id": f"result:{job_id}:1"},
            )
        await client.flush()
        await wait_for(lambda: bridge.inbox.stats.applied >= 2 * len(rows), 600, "inbox drained")
        elapsed = time.perf_counter() - started
    await client.close()
    print(
        f"inbox    envelopes={2 * len(rows)} seconds={elapsed:.2f} "
        f"envelopes_per_s={2 * len(rows) / elapsed:,.0f} done={count(url, 'done')}"
    )


async def main(n: int, batch: int) -> None:
    with tempfile.TemporaryDirectory(prefix="arm-bench-") as tmp:
        pg = EmbeddedPostgres(base_dir=Path(tmp) / "pg").start()
        nats_server = EmbeddedNats(log_dir=Path(tmp) / "nats").start()
        try:
            pg.create_database("bench")
            url = pg.url("bench")
            migrate(url)
            await bench_publish(url, nats_server.url(), n, batch)
            await bench_inbox(url, nats_server.url(), min(n, 5000))
        finally:
            nats_server.stop()
            pg.destroy()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.batch))
