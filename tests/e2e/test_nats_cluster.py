"""The exchange on a three-node NATS cluster: the core connects with
NATS_URL listing every node, the services sit on the other nodes, and the core's node is
killed with kill -9 in the middle of a flow of uploads. The core reconnects to another
node; nothing it marked published went undelivered except what the dead node held at
the instant of the kill, and the ack timeout republishes those; every job ends done.

With JetStream capture (RESULTS_STREAM, replicas 3) the answers published while the core
was moving are kept by the stream and applied: nothing is lost either."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNatsCluster
from arm_core.devtools.testbed.cluster import (
    RecordingService,
    close_all,
    core_node,
    move_stream_leader,
    recording_service,
    stream_leader,
    wait_interest,
)
from arm_core.devtools.testbed.faults import metric
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, Stack
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.sql import Conn, dict_conn, scalar, steady_uploads

pytestmark = pytest.mark.e2e

LIVE = (
    "SELECT count(*) FROM arm.recognition_job WHERE status IN ('queued', 'published', 'processing')"
)
DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    # --no_advertise: a client knows only the URLs it was given (here the proxies below),
    # not the nodes' own addresses.
    args = ["--no_advertise"]
    with EmbeddedNatsCluster(size=3, base_dir=tmp_path / "nats", extra_args=args) as nodes:
        yield nodes


@pytest.fixture
def js_cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    args = ["--no_advertise"]
    with EmbeddedNatsCluster(
        size=3, base_dir=tmp_path / "nats", jetstream=True, extra_args=args
    ) as nodes:
        yield nodes


def cluster_stack(db_url: str, cluster: EmbeddedNatsCluster, tmp: Path) -> Stack:
    # Stack.nats is one node; NATS_URL below lists all three.
    return Stack(db_url=db_url, nats=cluster.nodes[0], tmp=tmp, results=tmp / "results")


async def healthy(proc: ArmProcess, port: int) -> bool:
    body = await asyncio.to_thread(proc.health, port)
    return body is not None and body.get("status") == "ok"


def db_now(conn: Conn) -> dt.datetime:
    now: dt.datetime = scalar(conn, "SELECT clock_timestamp()")
    return now


async def kill_core_node_mid_flow(
    stack: Stack,
    cluster: EmbeddedNatsCluster,
    core: Any,
    n: int,
    flow: asyncio.Task[None],
    proxies: list[TcpProxy] | None = None,
    noticed: bool = True,
) -> tuple[int, dt.datetime, float]:
    """Waits until a quarter of the flow is done, kill -9s the core's node, waits until
    the core is connected to another node. With `proxies` (the core's way to each node),
    the other nodes refuse the core until the flow has finished uploading and (with
    `noticed`) the core has logged that NATS is unreachable (after 5 s without a
    server): an outage the publisher lives through with uploads coming in. Returns
    (killed, DB time of the kill, seconds until the core was seen on another node)."""
    with dict_conn(stack.db_url) as conn:
        await wait_for(lambda: scalar(conn, DONE) >= n // 4, 60, "a quarter done")
        killed = await core_node(cluster, core)
        live_at_kill = scalar(conn, LIVE)
        if proxies is not None:
            for i, proxy in enumerate(proxies):
                if i != killed:
                    proxy.block()
        killed_at = db_now(conn)
        started = time.monotonic()
        cluster.kill(killed)
    assert live_at_kill > 0  # mid-flow: answers were on their way
    if proxies is not None:
        await wait_for(lambda: "NATS disconnected" in core.log(), 30, "the core disconnected")
        await flow  # every upload arrived while the core had no server
        # ... and the publisher has cycled without a server long enough to say so (a
        # batch caught in its confirmation at the kill waits out the flush timeout first).
        if noticed:
            await wait_for(lambda: "NATS unreachable" in core.log(), 60, "the outage noticed")
        for proxy in proxies:
            proxy.unblock()
    new_node = await core_node(cluster, core, 30)
    moved = time.monotonic() - started
    assert new_node != killed
    await wait_for(lambda: "NATS reconnected" in core.log(), 30, "the core says it reconnected")
    return killed, killed_at, moved


async def start_core(stack: Stack, proxies: list[TcpProxy], **env: Any) -> tuple[ArmProcess, int]:
    """`arm-core bridge` with NATS_URL listing the proxies of every node, once healthy,
    and its health port. Not stack.bridge(): its wait for health would block the loop the
    proxies run in."""
    health = free_port()
    core = stack.start(
        "bridge",
        BRIDGE_HEALTH_PORT=health,
        NATS_URL=",".join(f"nats://127.0.0.1:{p.port}" for p in proxies),
        **env,
    )
    await wait_for(lambda: healthy(core, health), 30, lambda: f"bridge healthy: {core.log()}")
    return core, health


async def stop_quietly(core: ArmProcess, health: int, services: list[RecordingService]) -> None:
    """Stops the services, waits until the core holds no answer (a service that answered
    a republished request late may have sent one more), then stops the core: a clean
    stop, whose log may say nothing of answers dropped at the shutdown."""
    await close_all(services)
    services.clear()
    await wait_for(
        lambda: metric(health, "arm_inbox_buffered") == 0, 30, "the core's inbox emptied"
    )
    assert await asyncio.to_thread(core.stop) == 0


def received_by(services: list[RecordingService]) -> Counter[str]:
    received: Counter[str] = Counter()
    for service in services:
        received.update(service.received)
    return received


def requests_lost(rows: list[dict[str, Any]], received: Counter[str]) -> list[dict[str, Any]]:
    """Jobs the database counts more publishes of than the services received."""
    return [r for r in rows if received[r["request_msg_id"]] < 1 + r["republish_count"]]


def answers_missing(rows: list[dict[str, Any]], received: Counter[str]) -> list[str]:
    """Jobs republished although every publish of them arrived: their answer was lost."""
    return [
        str(r["id"])
        for r in rows
        if r["republish_count"] > 0 and received[r["request_msg_id"]] >= 1 + r["republish_count"]
    ]


def errors_in(log: str) -> list[str]:
    """The core's ERROR lines, but for a batch refused or unconfirmed while its server
    died or was gone (rolled back, the jobs stay queued: bridge/publisher.py) and the
    outage's own line: the errors a dead node should cause."""
    expected = ("they stay as they were", "NATS unreachable for")
    return [
        line
        for line in log.splitlines()
        if (" ERROR " in line or " CRITICAL " in line) and not any(e in line for e in expected)
    ]


def job_rows(conn: Conn) -> list[dict[str, Any]]:
    return conn.execute(
        "SELECT id, status::text AS status, request_msg_id, republish_count, published_at "
        "FROM arm.recognition_job"
    ).fetchall()


@pytest.mark.parametrize("outage", [False, True], ids=["failover", "outage"])
async def test_kill_9_of_the_core_nodes_server_mid_flow(
    db_url: str, cluster: EmbeddedNatsCluster, tmp_path: Path, outage: bool
) -> None:
    """failover: the core moves to another node at once (tens of milliseconds on
    loopback). outage: the other nodes refuse the core until every upload of the flow
    has arrived, so the publisher cycles without a server for a while — and must mark
    nothing published in that time."""
    n = 600
    stack = cluster_stack(db_url, cluster, tmp_path)
    services: list[RecordingService] = []
    proxies = [await TcpProxy(node.port or 0).start() for node in cluster.nodes]
    try:
        core, health = await start_core(
            stack,
            proxies,
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

        flow = asyncio.create_task(steady_uploads(db_url, n))
        killed, killed_at, moved = await kill_core_node_mid_flow(
            stack, cluster, core, n, flow, proxies if outage else None
        )
        await flow
        with dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, LIVE) == 0, 120, "no job left live")
            rows = job_rows(conn)
            results = scalar(
                conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
            )
        assert killed == home

        received = received_by(services)
        # Every job done, each result applied once, none stuck, none timed out.
        assert len(rows) == n and {r["status"] for r in rows} == {"done"}
        assert results == n
        # What the database marks published was delivered: every job's request reached a
        # service. A publish that did not arrive (the database counts more publishes of a
        # job than the services received) was in the dead node at the kill: the job was
        # first published before it, and the ack timeout published it again.
        assert all(received[r["request_msg_id"]] >= 1 for r in rows)
        lost = requests_lost(rows, received)
        assert all(r["published_at"] <= killed_at for r in lost), [
            (str(r["id"]), r["published_at"], killed_at) for r in lost
        ]
        republished = sum(1 for r in rows if r["republish_count"] > 0)
        missing = len(answers_missing(rows, received))
        print(
            f"\ncluster kill -9 of the core's node ({'outage' if outage else 'failover'}): "
            f"{n} jobs, {n} done, {len(lost)} publishes lost in the dead node "
            f"(republished), {missing} answers lost (republished), {republished} jobs "
            f"republished, core on another node after "
            f"{moved:.2f} s"
        )
        await stop_quietly(core, health, services)
        assert not errors_in(core.log())
    finally:
        await close_all(services)
        for proxy in proxies:
            await proxy.close()
        for proc in stack.procs:
            if proc.proc.poll() is None:
                proc.kill()


async def test_results_stream_replicas_3_loses_nothing_when_the_core_node_dies(
    db_url: str, js_cluster: EmbeddedNatsCluster, tmp_path: Path
) -> None:
    """The outage above with RESULTS_STREAM (replicas 3) and conforming services (the
    ack, then the result): the answers sent while the core had no server are kept by the
    stream and applied, so no job needs a republish for a missing answer — without the
    stream those jobs are republished (the outage test counts them) or wait for their
    reply deadline."""
    cluster = js_cluster
    n = 600
    stack = cluster_stack(db_url, cluster, tmp_path)
    services: list[RecordingService] = []
    proxies = [await TcpProxy(node.port or 0).start() for node in cluster.nodes]
    try:
        # ACK_TIMEOUT_SECONDS 30: far longer than the outage (about 1 s: until the flow's
        # uploads are in), so an ack kept by the stream is applied before its job could
        # be republished for want of it.
        core, health = await start_core(
            stack,
            proxies,
            OUTBOX_BATCH_SIZE=50,
            ACK_TIMEOUT_SECONDS=30,
            OUTBOX_MAX_REPUBLISH=10,
            TABULAR_REPLY_TIMEOUT_SECONDS=300,
            RESULTS_STREAM="ARM_RESULTS",
            RESULTS_STREAM_REPLICAS=3,
        )
        home = await core_node(cluster, core)
        others = [i for i in range(cluster.size) if i != home]
        services = [await recording_service(cluster.nodes[i].url(), ack=True) for i in others]
        await wait_interest(cluster.nodes[home].url())

        # The stream's leader on a node that stays up, every time. A stream captures a
        # core NATS publish only through its leader: when the node that dies leads the
        # stream, the answers published until the replicas have elected another leader
        # (about 5 s here) are not captured — services publish with core NATS and nobody
        # tells them. Measured, not asserted: see docs/not-losing-answers.md "On a NATS cluster".
        await move_stream_leader(cluster, "ARM_RESULTS", others[0])
        flow = asyncio.create_task(steady_uploads(db_url, n))
        killed, _, moved = await kill_core_node_mid_flow(
            stack, cluster, core, n, flow, proxies, noticed=False
        )
        assert killed == home
        assert stream_leader(cluster, "ARM_RESULTS") == cluster.name(others[0])
        await flow
        with dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, LIVE) == 0, 120, "no job left live")
            rows = job_rows(conn)
            results = scalar(
                conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
            )
        received = received_by(services)
        # Nothing lost: every job done — none waited for its reply deadline with its
        # result lost — every result applied once, and no job was republished although
        # each of its requests had arrived (that is: for an answer that went missing).
        assert len(rows) == n and {r["status"] for r in rows} == {"done"}
        assert results == n
        missing_answers = answers_missing(rows, received)
        assert missing_answers == []
        print(
            f"\ncluster kill -9 of the core's node (outage, RESULTS_STREAM "
            f"replicas 3): {n} jobs, {n} done, 0 answers lost, "
            f"{len(requests_lost(rows, received))} publishes lost in the dead node, core on "
            f"another node after {moved:.2f} s"
        )
        await stop_quietly(core, health, services)
        assert not errors_in(core.log())
    finally:
        await close_all(services)
        for proxy in proxies:
            await proxy.close()
        for proc in stack.procs:
            if proc.proc.poll() is None:
                proc.kill()
