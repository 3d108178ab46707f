"""kill -9 of the NATS node that leads RESULTS_STREAM, mid-flow.

Three nodes with JetStream, the stream with 3 replicas (the bridges create it), two
`arm-core bridge`s with NATS_URL listing every node, a steady flow of uploads; the
stream's leader is moved to node 3 and node 3 is killed once a quarter of the jobs are
done. The other two take seconds to elect a new leader (the test prints how many), and
until then nothing on the stream's subject is stored.

- A service that answers through JetStream publish (the real `arm-core reference`,
  which does so wherever a stream captures the result subject) gets no PubAck in that
  window, keeps its answers queued and sends them again with back-off: every job done,
  no answer lost, none applied twice.
- A service that answers with core NATS (on a node that stays up) publishes into the
  window. The bridges also receive its answers by core NATS and keep the last 15 s of
  them (bridge/replay.py); when the new leader is elected they apply them again: every
  job done, none applied twice.

What core publishing loses when the bridges keep nothing (RESULTS_STREAM_REPLAY_SECONDS=0)
is a measurement, not a promise: `make chaos` measures it (its row "bridges replay
nothing"; docs/not-losing-answers.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arm_core.devtools.embedded_nats import EmbeddedNatsCluster
from arm_core.devtools.testbed.cluster import (
    RecordingService,
    close_all,
    move_stream_leader,
    recording_service,
    reference_on_stream,
    start_bridge,
    stream_leader,
    wait_interest,
)
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, log_lines
from arm_core.devtools.testbed.sql import dict_conn, scalar, steady_uploads

pytestmark = pytest.mark.e2e

STREAM = "ARM_RESULTS"
JOBS = 1200
CHUNK = 10  # files per upload transaction, one every 50 ms: 6 s of flow
LEADER = 2  # the node the stream's leader is moved to, then killed
LIVE = (
    "SELECT count(*) FROM arm.recognition_job WHERE status IN ('queued', 'published', 'processing')"
)
DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"


@pytest.fixture
def js_cluster(tmp_path: Path) -> Iterator[EmbeddedNatsCluster]:
    with EmbeddedNatsCluster(size=3, base_dir=tmp_path / "nats", jetstream=True) as nodes:
        yield nodes


@pytest.mark.parametrize("publisher", ["jetstream", "core"])
async def test_kill_9_of_the_stream_leaders_node_mid_flow(
    db_url: str, js_cluster: EmbeddedNatsCluster, tmp_path: Path, publisher: str
) -> None:
    cluster = js_cluster
    stack = Stack(db_url=db_url, nats=cluster.nodes[0], tmp=tmp_path, results=tmp_path / "res")
    # Nothing is lost, and a deadline far away shows it.
    deadline = 300
    env = {
        "RESULTS_STREAM": STREAM,
        "RESULTS_STREAM_REPLICAS": 3,
        "ACK_TIMEOUT_SECONDS": 30,
        "OUTBOX_MAX_REPUBLISH": 10,
        "TABULAR_REPLY_TIMEOUT_SECONDS": deadline,
        "IMAGE_REPLY_TIMEOUT_SECONDS": deadline,
        "DEBUG": "true",  # a log line per result applied
    }
    services: list[RecordingService] = []
    try:
        bridges = [await start_bridge(stack, cluster, **env) for _ in range(2)]
        await wait_for(lambda: stream_leader(cluster, STREAM) is not None, 30, "the stream")
        await move_stream_leader(cluster, STREAM, LEADER)
        if publisher == "jetstream":
            reference = await reference_on_stream(stack, cluster, STREAM)
        else:
            services = [await recording_service(cluster.nodes[0].url(), ack=True)]
            await wait_interest(cluster.nodes[1].url())
        uploads = asyncio.create_task(steady_uploads(db_url, JOBS, CHUNK))
        with dict_conn(db_url) as conn:
            await wait_for(lambda: scalar(conn, DONE) >= JOBS // 4, 60, "a quarter done")
            assert stream_leader(cluster, STREAM) == cluster.name(LEADER)
            live_at_kill = scalar(conn, LIVE)
            cluster.kill(LEADER)
            killed = time.monotonic()
            await wait_for(
                lambda: stream_leader(cluster, STREAM) not in (None, cluster.name(LEADER)),
                30,
                "a new leader",
            )
            elected = time.monotonic() - killed
            await uploads
            await wait_for(lambda: scalar(conn, LIVE) == 0, 150, "no job left live")
            rows = conn.execute(
                "SELECT status::text AS status, count(*) AS n, "
                "       count(*) FILTER (WHERE republish_count > 0) AS republished "
                "FROM arm.recognition_job GROUP BY status"
            ).fetchall()
            results = scalar(
                conn, "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
            )
        by_status = {r["status"]: r["n"] for r in rows}
        republished = sum(r["republished"] for r in rows)
        lost = JOBS - by_status.get("done", 0)
        print(
            f"\nkill -9 of the stream leader's node, {publisher} publishing: {JOBS} jobs "
            f"({live_at_kill} live at the kill), new leader after {elected:.1f} s, "
            f"lost {lost} ({by_status}), {republished} republished"
        )
        assert live_at_kill > 0
        applied: dict[str, int] = {}
        for bridge in bridges:
            for line in log_lines(bridge.log(), action="result"):
                if "result applied" in line:
                    job = line.split(" job_id=")[1].split()[0]
                    applied[job] = applied.get(job, 0) + 1
        assert set(applied.values()) <= {1}, "a result applied twice"
        assert results == by_status.get("done", 0) + by_status.get("needs_check", 0)
        if publisher == "jetstream":
            assert by_status == {"done": JOBS}
            # It did meet the window: publishes not acknowledged, answers kept and resent.
            assert log_lines(reference.log(), action="ref_waiting"), reference.log()[-3000:]
        else:
            assert by_status == {"done": JOBS}
            # The window's answers came from the bridges' replay at the election.
            assert any(log_lines(b.log(), action="stream_replay") for b in bridges)
    finally:
        await close_all(services)
        for proc in stack.procs:
            if proc.proc.poll() is None:
                proc.kill()
