"""Publish drain: N queued jobs → published with server-confirmed delivery, through a
real `arm-core bridge` and a real nats-server.

The bridge starts first with nothing queued and is healthy (connected, subscribed)
before the backlog goes in, in one transaction; the clock starts when that transaction
has committed and stops at the last `published_at` the bridge wrote (the database's
clock; polling only says when to look). A subscriber in this process counts the
requests as a service would receive them. Nobody acks, so ACK_TIMEOUT_SECONDS is an
hour here: no republish mixes into the figure, and PACING is off (paced, a service that
never answers gets only the floor).

The same drain paced (PACING=auto, the default) needs a service that answers: an
instant one in this process (the testbed's), which acks and answers every request at once,
so the bridge applies two envelopes per job while it publishes. The limit starts at its
floor and grows with the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import nats
from nats.aio.msg import Msg

from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.services import instant_service
from benchmarks.harness import Bench, commits, connect, publish_batches, scalar
from benchmarks.report import Report
from benchmarks.uploads import upload_files

SECTION = "5 publish"
POLL_SECONDS = 0.25


@dataclass
class Drain:
    jobs: int
    seconds: float
    first_publish_after: float  # commit of the backlog → first published_at
    batches: int
    commits: int  # every commit in the database during the drain, less this process's own
    received: int
    unique: int
    cpu: str  # CPU of each process while the backlog drained
    pacing: str = "off"

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


class Counter:
    """Counts the requests a service would receive; `all_in` is set at `expected`."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.ids: list[str] = []
        self.all_in = asyncio.Event()

    async def on_message(self, msg: Msg) -> None:
        self.ids.append((msg.headers or {}).get("Nats-Msg-Id", ""))
        if len(self.ids) >= self.expected:
            self.all_in.set()


async def drain(bench: Bench, n: int, pacing: str = "off") -> Drain:
    url = bench.fresh_database(f"publish_{n}_{pacing}")
    client = await nats.connect(bench.nats_url)
    service = await instant_service(bench.nats_url) if pacing != "off" else None
    counter = Counter(n)
    for subject in ("files.tabular_uploaded", "files.img_uploaded"):
        await client.subscribe(
            subject, cb=counter.on_message, pending_msgs_limit=-1, pending_bytes_limit=-1
        )
    await client.flush()
    try:
        async with bench.bridge(url, ACK_TIMEOUT_SECONDS="3600", PACING=pacing) as proc:
            before = commits(url)
            with connect(url) as conn:
                await asyncio.to_thread(upload_files, conn, n, "publish")
            committed = time.time()
            meter = bench.cpu_meter(bridge=proc.proc.pid).start()
            polls = await _wait_until_published(url, within=max(120.0, n / 50))
            meter.stop()
            first, last = await asyncio.to_thread(
                scalar,
                url,
                "SELECT ARRAY[extract(epoch FROM min(published_at)),"
                " extract(epoch FROM max(published_at))]::float8[] FROM arm.recognition_job",
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(counter.all_in.wait(), 30)
            log = proc.log()
        # Read after the bridge has stopped: an idle backend reports its counters up to
        # 10 s late, one that exits reports them at once. Less this process's own
        # commits: the first commits() (2), the upload, the polls, the published_at read.
        total = commits(url) - before - 2 - 1 - polls - 1
    finally:
        await client.close()
        if service is not None:
            await service.client.close()
    bench.drop_database(url)
    return Drain(
        jobs=n,
        seconds=last - committed,
        first_publish_after=first - committed,
        batches=publish_batches(log),
        commits=total,
        received=len(counter.ids),
        unique=len(set(counter.ids)),
        cpu=meter.describe(),
        pacing=pacing,
    )


async def _wait_until_published(url: str, within: float) -> int:
    """Polls (a few times a second) until no job is queued; returns how many polls."""
    queued: list[int] = []  # what each poll saw

    async def none_queued() -> bool:
        queued.append(
            await asyncio.to_thread(
                scalar, url, "SELECT count(*) FROM arm.recognition_job WHERE status = 'queued'"
            )
        )
        return queued[-1] == 0

    await wait_for(
        none_queued,
        within,
        lambda: f"every job published: {queued[-1]} still queued",
        every=POLL_SECONDS,
    )
    return len(queued)


async def run(bench: Bench, report: Report) -> None:
    s = bench.sizes
    small = await drain(bench, s.publish_small)
    _add(report, "publish.small", small, ref="pgbench")
    large = await drain(bench, s.publish_large)
    _add(report, "publish.large", large, ref="publish.small")
    compare = await drain(bench, s.compare_jobs)
    _add(report, "publish.compare", compare, ref="pgqueuer")
    paced = await drain(bench, s.compare_jobs, "auto")
    _add(report, "publish.compare.auto", paced, ref="pgqueuer", how="PACING=auto, ")
    report.add(
        "publish.cpu",
        SECTION,
        f"  {large.jobs:,} drain: CPU, % of one core (2 cores = 200%)",
        text=large.cpu,
    )
    for d in (small, large, compare, paced):
        report.add(
            f"publish.txns.{d.jobs}.{d.pacing}",
            SECTION,
            f"  {d.jobs:,} jobs, PACING={d.pacing}: publish transactions per 1,000 jobs "
            "(bridge log) · all commits in the database per 1,000 jobs",
            text=f"{d.batches * 1000 / d.jobs:.1f} · {d.commits * 1000 / d.jobs:.1f}",
        )
        if d.received < d.jobs or d.unique < d.jobs:
            report.note(
                f"Publish drain of {d.jobs:,}: the subscriber received {d.received:,} "
                f"requests ({d.unique:,} distinct Nats-Msg-Id)."
            )
    report.note(
        "Publish drain: clock from the commit of the backlog (one transaction, bridge already "
        "healthy) to the last published_at; first publish came "
        + ", ".join(f"{d.first_publish_after * 1000:.0f} ms" for d in (small, large, compare))
        + " after the commit. All commits include the bridge's idle ticks (schedule, "
        "dead-letter and republish checks), not only publish batches."
    )


def _add(report: Report, key: str, d: Drain, ref: str, how: str = "PACING=off, ") -> None:
    report.add(
        key,
        SECTION,
        f"arm-core publish drain, {how}{d.jobs:,} queued → published (confirmed), "
        f"{d.received:,} received",
        d.rate,
        "jobs/s",
        ref=ref,
        short=f"publish drain {d.jobs:,}" + (", auto" if "auto" in how else ""),
    )
