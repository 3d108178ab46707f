"""The results stream on disk: answers per second through RESULTS_STREAM (3 replicas on
a three-node cluster of its own) with JetStream's `sync_interval: always` — each message
written to disk (fsync) on each node before the stream acknowledges it, as
deploy/nats/nats-server.conf sets it — against nats-server's default (a sync every 2
minutes), in the same run.

(a) End to end: a real `arm-core bridge` (RESULTS_STREAM, replicas 3) and the real
    `arm-core reference` (both services, no delay, answering through JetStream publish:
    each answer waits for its PubAck); N jobs uploaded in one transaction; the clock
    runs from that commit to the last job's `finished_at` (the database's clock). Two
    answers per job (ack, result) go through the stream: the figure is 2N ÷ that time.
    The two settings alternate, twice each (once with --quick), each on a fresh cluster
    and database; the median of each is shown.
(b) The stream alone: this process publishes N messages of 300 bytes through JetStream
    to a stream of 3 replicas, 64 awaiting their PubAck at a time; messages per second.
"""

from __future__ import annotations

import asyncio
import time

import nats
from nats.js.api import StorageType, StreamConfig

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNatsCluster
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, log_lines
from arm_core.devtools.testbed.sql import dict_conn, upload_many
from benchmarks.harness import Bench, median, progress, scalar
from benchmarks.report import Report

SECTION = "13 stream on disk"
STREAM = "ARM_BENCH_RESULTS"
SETTINGS = {"default": None, "always": "always"}
IN_FLIGHT = 64
PAYLOAD = b"x" * 300


def cluster_of(bench: Bench, sync: str | None) -> EmbeddedNatsCluster:
    base = bench.workdir / f"stream-{sync or 'default'}-{time.monotonic_ns()}"
    return EmbeddedNatsCluster(size=3, base_dir=base, jetstream=True, sync_interval=sync)


async def end_to_end(bench: Bench, sync: str | None, jobs: int) -> float:
    """Answers per second through the stream, bridge to reference and back."""
    url = bench.fresh_database(f"stream_{sync or 'default'}")
    cluster = await asyncio.to_thread(cluster_of(bench, sync).start)
    procs: list[ArmProcess] = []
    env = {"NATS_URL": cluster.url(), "RESULTS_STREAM": STREAM, "RESULTS_STREAM_REPLICAS": "3"}
    try:
        port = free_port()
        bridge = ArmProcess(
            "bridge",
            {
                **env,
                "DATABASE_URL": url,
                "HTTP_HOST": "127.0.0.1",
                "BRIDGE_HEALTH_PORT": str(port),
                "PACING": "off",  # the stream's pace, not the service's
            },
            bench.workdir / f"stream-bridge-{port}.log",
        )
        procs.append(bridge)
        await asyncio.to_thread(bridge.wait_healthy, port, 60)
        reference = ArmProcess(
            "reference",
            {
                **env,
                "REFERENCE_DELAY_SECONDS": "0",
                "REFERENCE_RESULTS_DIR": str(bench.workdir / "stream-results"),
            },
            bench.workdir / f"stream-reference-{port}.log",
        )
        procs.append(reference)
        await wait_for(
            lambda: len(log_lines(reference.log(), action="ref_stream")) >= 2,
            60,
            "the reference answering through the stream",
        )
        with dict_conn(url) as conn:
            upload_many(conn, jobs, mixed=True)
            began = scalar(url, "SELECT extract(epoch FROM clock_timestamp())")
        done = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"
        await wait_for(lambda: scalar(url, done) == jobs, max(120.0, jobs / 20), f"{jobs} done")
        ended = scalar(url, "SELECT extract(epoch FROM max(finished_at)) FROM arm.recognition_job")
        return 2 * jobs / (float(ended) - float(began))
    finally:
        for proc in procs:
            if proc.proc.poll() is None:
                proc.kill()
        await asyncio.to_thread(cluster.stop)
        bench.drop_database(url)


async def stream_alone(bench: Bench, sync: str | None, messages: int) -> float:
    """JetStream publishes per second to a stream of 3 replicas, IN_FLIGHT at a time."""
    cluster = await asyncio.to_thread(cluster_of(bench, sync).start)
    nc = await nats.connect(cluster.urls())
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name=STREAM, subjects=["bench.stream"], num_replicas=3, storage=StorageType.FILE
            )
        )
        slots = asyncio.Semaphore(IN_FLIGHT)

        async def one() -> None:
            async with slots:
                await js.publish("bench.stream", PAYLOAD, timeout=30)

        began = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(messages)))
        return messages / (time.perf_counter() - began)
    finally:
        await nc.close()
        await asyncio.to_thread(cluster.stop)


async def run(bench: Bench, report: Report) -> None:
    jobs = bench.sizes.stream_jobs
    repeats = 1 if jobs < 1000 else 2
    rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(repeats):
        for name, sync in SETTINGS.items():
            progress(f"stream on disk: {jobs:,} jobs end to end, sync_interval {name}")
            rates[name].append(await end_to_end(bench, sync, jobs))
    alone: dict[str, float] = {}
    for name, sync in SETTINGS.items():
        progress(f"stream on disk: {4 * jobs:,} JetStream publishes, sync_interval {name}")
        alone[name] = await stream_alone(bench, sync, 4 * jobs)
    rows: list[tuple[str, str, float, str | None]] = [
        ("stream.e2e.default", f"answers through RESULTS_STREAM (3 replicas), {jobs:,} jobs, "
         "bridge and reference, sync_interval default (2 min)", median(rates["default"]), None),
        ("stream.e2e.always", "the same, sync_interval always (each message on disk before "
         "its PubAck)", median(rates["always"]), "stream.e2e.default"),
        ("stream.alone.default", f"JetStream publishes to 3 replicas, {IN_FLIGHT} awaiting "
         "their PubAck, sync_interval default", alone["default"], None),
        ("stream.alone.always", "the same, sync_interval always", alone["always"],
         "stream.alone.default"),
    ]  # fmt: skip
    for key, measure, value, ref in rows:
        short = "sync_interval default" if ref is None else ""
        report.add(key, SECTION, measure, value, "/s", ref=ref, short=short)
