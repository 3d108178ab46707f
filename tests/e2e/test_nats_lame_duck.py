"""A planned rolling restart of all three NATS nodes under a steady flow:
each node in turn is put in lame-duck mode (`nats-server --signal ldm=<pid>`, as an
operator does before an upgrade), waited for until it has exited, started again on its
ports and given time to catch up on RESULTS_STREAM before the next one. Two bridges
(NATS_URL listing every node) and the services are moved at least once each.

A node in lame-duck mode stops accepting clients, hands the leadership of the streams
and consumers it leads to another node, tells its clients after its grace period (they
move to another node at once) and closes those that have not moved.

- Services that answer through JetStream publish (the real `arm-core reference`).
- Services that answer with core NATS (RecordingService, moving when told). Their
  answers are stored only through the stream's leader, and while its leadership moves
  (tens of milliseconds) nothing published on the subject is stored — 3 to 8 answers
  per hand-over at this rate when the bridges kept nothing. The bridges keep what core
  NATS brought them lately and apply it again when the stream announces its new leader
  (bridge/replay.py): nothing lost.

Judged for both: every job `done`, each result applied once (the bridges' DEBUG lines
and the result objects), and no job republished although every request of it had
reached a service (an answer lost on the way back). ACK_TIMEOUT_SECONDS is 30 s, six
times the stream consumer's ack_wait (RESULTS_STREAM_ACK_WAIT_SECONDS, 5 s here): an
answer fetched by a bridge whose connection was moving comes again from the stream after
5 s, long before its job could be republished for want of it."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from arm_core.devtools.embedded_nats import EmbeddedNatsCluster
from arm_core.devtools.testbed.cluster import (
    RecordingService,
    close_all,
    recording_service,
    reference_on_stream,
    start_bridge,
    stream_leader,
    stream_whole,
    wait_interest,
)
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, log_lines
from arm_core.devtools.testbed.sql import Conn, dict_conn, scalar
from tests.support.flow import DONE, Flow, applied_results

pytestmark = pytest.mark.e2e

STREAM = "ARM_RESULTS"
LIVE = (
    "SELECT count(*) FROM arm.recognition_job WHERE status IN ('queued', 'published', 'processing')"
)


def done_beyond(conn: Conn, count: int) -> bool:
    return bool(scalar(conn, DONE) >= count)


@pytest.fixture
def js_cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    with EmbeddedNatsCluster(
        size=3, base_dir=tmp_path / "nats", jetstream=True, lame_duck_grace=1
    ) as nodes:
        yield nodes


@pytest.mark.parametrize("publisher", ["jetstream", "core"])
async def test_lame_duck_rolling_restart_of_the_nats_cluster(
    db_url: str, js_cluster: EmbeddedNatsCluster, tmp_path: Path, publisher: str
) -> None:
    cluster = js_cluster
    stack = Stack(db_url=db_url, nats=cluster.nodes[0], tmp=tmp_path, results=tmp_path / "res")
    env = {
        "RESULTS_STREAM": STREAM,
        "RESULTS_STREAM_REPLICAS": 3,
        # A request lost with a service's connection (core NATS: at most once) is
        # published again after 30 s — the drain's wait when one was; a lost result
        # would leave its job waiting for the reply deadline, far beyond the test.
        "ACK_TIMEOUT_SECONDS": 30,
        "RESULTS_STREAM_ACK_WAIT_SECONDS": 5,
        "OUTBOX_MAX_REPUBLISH": 10,
        "TABULAR_REPLY_TIMEOUT_SECONDS": 600,
        "IMAGE_REPLY_TIMEOUT_SECONDS": 600,
        "DEBUG": "true",  # a log line per result applied
    }
    urls = cluster.urls()
    services: list[RecordingService] = []
    handovers: list[float] = []  # when the stream leader's node entered lame-duck mode
    moves: list[str] = []
    try:
        bridges = [await start_bridge(stack, cluster, **env) for _ in range(2)]
        await stream_whole(cluster, STREAM)
        if publisher == "jetstream":
            await reference_on_stream(stack, cluster, STREAM)
        else:
            # One starting on node 1, one on node 2, each with every node in its list.
            services = [await recording_service(urls[i:] + urls[:i], ack=True) for i in range(2)]
            for url in urls:
                await wait_interest(url)
        with Flow(db_url, per_step=5) as flow, dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, DONE) >= 200, 60, "the flow running")
            for index in range(cluster.size):
                before = stream_leader(cluster, STREAM)
                done_before = scalar(conn, DONE)
                if before == cluster.name(index):
                    handovers.append(time.monotonic())
                took = await asyncio.to_thread(cluster.lame_duck, index)
                after = stream_leader(cluster, STREAM)
                await asyncio.to_thread(cluster.start_node, index)
                await stream_whole(cluster, STREAM)
                moves.append(f"{cluster.name(index)} out in {took:.1f} s ({before} -> {after})")
                # Answers go on being applied between restarts.
                await wait_for(
                    functools.partial(done_beyond, conn, done_before + 100), 60, "the flow goes on"
                )
            n = flow.stop()
            started = time.monotonic()
            await wait_for(lambda: scalar(conn, LIVE) == 0, 180, "no job left live")
            drained = time.monotonic() - started
            rows = conn.execute(
                "SELECT id, status::text AS status, request_msg_id, republish_count "
                "FROM arm.recognition_job"
            ).fetchall()
            results = scalar(
                conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
            )
        by_status = Counter(r["status"] for r in rows)
        republished = [r for r in rows if r["republish_count"] > 0]
        # A bridge logs "result applied" just after its batch commits: the database may be
        # read before the last lines are written.
        await wait_for(
            lambda: len(applied_results([b.log() for b in bridges])) >= n,
            30,
            "every applied result in the bridges' logs",
        )
        applied = applied_results([b.log() for b in bridges])
        lost_at: list[float] = []
        if publisher == "core":
            received: Counter[str] = Counter()
            sent_at: dict[str, float] = {}
            for service in services:
                received.update(service.received)
                for job, at in service.sent_at.items():
                    sent_at[job] = min(at, sent_at.get(job, at))
            # Published again although every publish of it had reached a service: its
            # answers were lost on the way back.
            lost_at = [
                sent_at[str(r["id"])]
                for r in republished
                if received[r["request_msg_id"]] >= 1 + r["republish_count"]
            ]
        print(
            f"\nlame-duck rolling restart of 3 NATS nodes, {publisher} publishing: {n} jobs, "
            f"{by_status['done']} done, "
            + (
                f"{len(lost_at)} answers lost at {len(handovers)} leader hand-over(s), "
                if publisher == "core"
                else "answers held until a PubAck, "
            )
            + f"{len(republished)} republished (a request lost or its answers), "
            f"drained {drained:.1f} s after the flow; " + "; ".join(moves)
        )
        # 0 lost, 0 stuck, 0 applied twice.
        assert len(rows) == n and by_status == {"done": n}
        assert results == n
        assert set(applied.values()) == {1} and len(applied) == n
        assert handovers  # the leader's node was restarted too
        # Nothing lost on the way back, even by core publishers.
        assert lost_at == []
        if publisher == "core":  # the bridges did replay at the hand-overs
            replays = [log_lines(b.log(), action="stream_replay") for b in bridges]
            assert all(replays), "a bridge applied nothing again at an election"
    finally:
        await close_all(services)
        for proc in stack.procs:
            if proc.proc.poll() is None:
                proc.kill()
