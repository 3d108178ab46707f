"""The exchange on a three-node NATS cluster (issue 12, part 3): the core connects with
NATS_URL listing every node, the services sit on the other nodes, and the core's node is
killed with kill -9 in the middle of a flow of uploads. The core reconnects to another
node; nothing it marked published went undelivered except what the dead node held at
the instant of the kill, and the ack timeout republishes those; every job ends done.

With JetStream capture (RESULTS_STREAM, replicas 3) the answers published while the core
was moving are kept by the stream and applied: nothing is lost either."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arm_core.config import Settings
from arm_core.devtools.embedded import EmbeddedNatsCluster
from tests.support.bridge import wait_for
from tests.support.cluster import (
    RecordingService,
    close_all,
    core_node,
    recording_service,
    wait_interest,
)
from tests.support.sql import Conn, dict_conn, scalar, upload_many
from tests.support.stack import Stack

pytestmark = pytest.mark.e2e

LIVE = (
    "SELECT count(*) FROM arm.recognition_job WHERE status IN ('queued', 'published', 'processing')"
)
DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    with EmbeddedNatsCluster(size=3, base_dir=tmp_path / "nats") as nodes:
        yield nodes


@pytest.fixture
def js_cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    with EmbeddedNatsCluster(size=3, base_dir=tmp_path / "nats", jetstream=True) as nodes:
        yield nodes


def cluster_stack(db_url: str, cluster: EmbeddedNatsCluster, tmp: Path) -> Stack:
    # Stack.nats is one node; NATS_URL below lists all three.
    return Stack(db_url=db_url, nats=cluster.nodes[0], tmp=tmp, results=tmp / "results")


async def uploads(db_url: str, n: int, chunk: int = 20) -> None:
    """A steady flow: n uploads, `chunk` at a time, one chunk every 50 ms."""

    def flow() -> None:
        with dict_conn(db_url) as conn:
            for _ in range(n // chunk):
                upload_many(conn, chunk)
                time.sleep(0.05)

    await asyncio.to_thread(flow)


def db_now(conn: Conn) -> dt.datetime:
    now: dt.datetime = scalar(conn, "SELECT clock_timestamp()")
    return now


async def kill_core_node_mid_flow(
    stack: Stack, cluster: EmbeddedNatsCluster, core: Any, n: int
) -> tuple[int, int, dt.datetime, float]:
    """Waits until a quarter of the flow is done, kill -9s the core's node, waits until
    the core is connected to another node. Returns (killed, new node, DB time of the
    kill, seconds until the core was seen on the new node)."""
    with dict_conn(stack.db_url) as conn:
        await wait_for(lambda: scalar(conn, DONE) >= n // 4, 60, "a quarter done")
        killed = await core_node(cluster, core)
        live_at_kill = scalar(conn, LIVE)
        killed_at = db_now(conn)
        started = time.monotonic()
        cluster.kill(killed)
    assert live_at_kill > 0  # mid-flow: jobs were on their way
    new_node = await core_node(cluster, core, 30)
    moved = time.monotonic() - started
    assert new_node != killed
    await wait_for(lambda: "NATS reconnected" in core.log(), 30, "the core says it reconnected")
    return killed, new_node, killed_at, moved


def errors_in(log: str) -> list[str]:
    """The core's ERROR lines, but for a publish refused while it had no server (the
    jobs stay queued: bridge/publisher.py) — the one error a dead node should cause."""
    return [
        line
        for line in log.splitlines()
        if (" ERROR " in line or " CRITICAL " in line)
        and not ("they stay as they were" in line and 'error="NATS not connected"' in line)
    ]


def job_rows(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT id, status::text AS status, request_msg_id, republish_count, published_at "
        "FROM arm.recognition_job"
    ).fetchall()


async def test_kill_9_of_the_core_nodes_server_mid_flow(
    db_url: str, cluster: EmbeddedNatsCluster, tmp_path: Path
) -> None:
    n = 600
    stack = cluster_stack(db_url, cluster, tmp_path)
    services: list[RecordingService] = []
    try:
        core = stack.bridge(
            NATS_URL=cluster.url(),
            OUTBOX_BATCH_SIZE=50,
            ACK_TIMEOUT_SECONDS=1,
            OUTBOX_MAX_REPUBLISH=10,
            TABULAR_REPLY_TIMEOUT_SECONDS=300,
        )
        home = await core_node(cluster, core)
        others = [i for i in range(cluster.size) if i != home]
        # Result-only answers: a lost answer leaves its job published, so the ack timeout
        # republishes it (an ack that arrived with its result lost would wait for the
        # reply deadline instead: that is what the stream test covers).
        services = [await recording_service(cluster.nodes[i].url()) for i in others]
        await wait_interest(cluster.nodes[home].url())

        flow = asyncio.create_task(uploads(db_url, n))
        killed, _, killed_at, moved = await kill_core_node_mid_flow(stack, cluster, core, n)
        await flow
        with dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, LIVE) == 0, 120, "no job left live")
            rows = job_rows(conn)
            results = scalar(
                conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
            )
        assert killed == home

        received = sum((s.received for s in services), start=type(services[0].received)())
        # Every job done, each result applied once, none stuck, none timed out.
        assert len(rows) == n and {r["status"] for r in rows} == {"done"}
        assert results == n
        # What the database marks published was delivered: every job's request reached a
        # service. A publish that did not arrive (the database counts more publishes of a
        # job than the services received) was in the dead node at the kill: the job was
        # first published before it, and the ack timeout published it again.
        assert all(received[r["request_msg_id"]] >= 1 for r in rows)
        lost = [r for r in rows if received[r["request_msg_id"]] < 1 + r["republish_count"]]
        assert all(r["published_at"] <= killed_at for r in lost), [
            (str(r["id"]), r["published_at"], killed_at) for r in lost
        ]
        republished = sum(1 for r in rows if r["republish_count"] > 0)
        print(
            f"\ncluster kill -9 of the core's node: {n} jobs, {n} done, "
            f"{len(lost)} publishes lost in the dead node (republished), "
            f"{republished} jobs republished, core on another node after {moved:.2f} s"
        )
        assert core.stop() == 0
        assert not errors_in(core.log())
    finally:
        await close_all(services)
        for proc in stack.procs:
            if proc.proc.poll() is None:
                proc.kill()


def _has_results_stream() -> bool:
    return "results_stream" in {f.name for f in dataclasses.fields(Settings)}


async def test_results_stream_replicas_3_loses_nothing_when_the_core_node_dies(
    db_url: str, js_cluster: EmbeddedNatsCluster, tmp_path: Path
) -> None:
    if not _has_results_stream():
        pytest.skip("RESULTS_STREAM not built yet")
    cluster = js_cluster
    n = 600
    stack = cluster_stack(db_url, cluster, tmp_path)
    services: list[RecordingService] = []
    try:
        core = stack.bridge(
            NATS_URL=cluster.url(),
            OUTBOX_BATCH_SIZE=50,
            ACK_TIMEOUT_SECONDS=1,
            OUTBOX_MAX_REPUBLISH=10,
            TABULAR_REPLY_TIMEOUT_SECONDS=300,
            RESULTS_STREAM="ARM_RESULTS",
            RESULTS_STREAM_REPLICAS=3,
        )
        home = await core_node(cluster, core)
        others = [i for i in range(cluster.size) if i != home]
        # Conforming services: the ack, then the result.
        services = [await recording_service(cluster.nodes[i].url(), ack=True) for i in others]
        await wait_interest(cluster.nodes[home].url())

        flow = asyncio.create_task(uploads(db_url, n))
        await kill_core_node_mid_flow(stack, cluster, core, n)
        await flow
        with dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, LIVE) == 0, 120, "no job left live")
            rows = job_rows(conn)
            results = scalar(
                conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
            )
        # Nothing lost: every job done — none waited for its reply deadline with its
        # result lost — and every result applied once.
        assert len(rows) == n and {r["status"] for r in rows} == {"done"}
        assert results == n
        sent = {key for s in services for key in s.results_sent}
        assert {f"{r['id']}:1" for r in rows} <= sent
        assert core.stop() == 0
        assert not errors_in(core.log())
    finally:
        await close_all(services)
        for proc in stack.procs:
            if proc.proc.poll() is None:
                proc.kill()
