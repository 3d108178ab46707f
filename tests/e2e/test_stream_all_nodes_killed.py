"""kill -9 of every node of the three-node cluster at once, while RESULTS_STREAM holds
answers it acknowledged and no bridge has applied.

The reference service answers through JetStream publish: each answer it hands over is
one the stream acknowledged (PubAck) after storing it on a quorum of nodes. The bridge
is stopped once every request is acked and before the results come, so the results wait
in the stream. Then all three nats-servers are killed, started again on their stores, and
a bridge comes up. Whatever happens, no job is left waiting: each ends `done`, or — where
the stream lost its answer — `timeout` by the reply deadline sweep, and retryable.

With `sync_interval: always` (deploy/nats/nats-server.conf, and the embedded cluster's
default) every message is on disk before the stream acknowledges it: nothing is lost,
every job ends `done`. With nats-server's default (a sync every 2 minutes) the same
holds for this fault — kill -9 of the processes leaves the operating system's page
cache, with what they wrote, in place; what that default loses is what a power cut or a
kernel crash takes from that cache, which no test on one machine can cut. The test of
that variant shows the outcome is final either way.
"""

from __future__ import annotations

import json
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from arm_core.devtools.embedded_nats import EmbeddedNatsCluster
from arm_core.devtools.testbed.cluster import reference_on_stream, start_bridge
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack
from arm_core.devtools.testbed.sql import dict_conn, scalar, upload_many

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

STREAM = "ARM_RESULTS"
JOBS = 200
# Every job's reply deadline: after the nodes are back and a bridge runs, an answer the
# stream lost ends its job `timeout` within this, and the test waits for that.
REPLY_DEADLINE = 45
LIVE = (
    "SELECT count(*) FROM arm.recognition_job WHERE status IN ('queued', 'published', 'processing')"
)
# Each file's current job: done, or failed by the sweep and retryable.
OUTCOMES = """
SELECT j.status::text AS status, arm.is_retryable(j.status, j.attempt, j.max_attempts) AS retryable,
       count(*) AS n
FROM arm.stored_file f JOIN arm.recognition_job j ON j.id = f.current_recognition_job_id
GROUP BY 1, 2 ORDER BY 1, 2
"""


def monitor(cluster: EmbeddedNatsCluster, index: int, path: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{cluster.monitor_ports[index]}{path}"
    with urllib.request.urlopen(url, timeout=2) as resp:
        loaded: dict[str, Any] = json.loads(resp.read())
    return loaded


def stream_messages(cluster: EmbeddedNatsCluster) -> int | None:
    """The messages the stream holds, as the first running node that knows its leader
    says (/jsz); None while none does."""
    for index in range(cluster.size):
        if not cluster.running(index):
            continue
        try:
            jsz = monitor(cluster, index, "/jsz?streams=true")
        except (OSError, ValueError):
            continue
        for account in jsz.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                if stream.get("name") == STREAM and stream.get("cluster", {}).get("leader"):
                    return int(stream["state"]["messages"])
    return None


@pytest.fixture(params=["always", None], ids=["sync-always", "sync-default"])
def js_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[EmbeddedNatsCluster]:
    cluster = EmbeddedNatsCluster(
        size=3, base_dir=tmp_path / "nats", jetstream=True, sync_interval=request.param
    )
    with cluster as nodes:
        yield nodes


async def test_every_job_ends_final_after_every_node_is_killed_at_once(
    db_url: str, js_cluster: EmbeddedNatsCluster, tmp_path: Path
) -> None:
    cluster = js_cluster
    # Each node runs with the sync_interval the variant says (/varz).
    synced = [
        monitor(cluster, i, "/varz")["jetstream"]["config"].get("sync_always", False)
        for i in range(cluster.size)
    ]
    assert synced == [cluster.sync_interval == "always"] * cluster.size
    stack = Stack(db_url=db_url, nats=cluster.nodes[0], tmp=tmp_path, results=tmp_path / "res")
    env = {
        "RESULTS_STREAM": STREAM,
        "RESULTS_STREAM_REPLICAS": 3,
        "ACK_TIMEOUT_SECONDS": 30,
        "TABULAR_REPLY_TIMEOUT_SECONDS": REPLY_DEADLINE,
        "IMAGE_REPLY_TIMEOUT_SECONDS": REPLY_DEADLINE,
        "PACING": "off",  # every request out at once, whatever the service's pace
    }
    try:
        bridge = await start_bridge(stack, cluster, **env)
        # Results 5 s after each ack: the bridge is gone by then.
        await reference_on_stream(stack, cluster, STREAM, REFERENCE_DELAY_SECONDS=5)
        with dict_conn(db_url) as conn:
            upload_many(conn, JOBS, mixed=True)
            unacked = (
                "SELECT count(*) FROM arm.recognition_job WHERE status IN ('queued', 'published')"
            )
            await wait_for(
                lambda: scalar(conn, unacked) == 0,
                60,
                lambda: f"every request acked ({scalar(conn, unacked)} not)",
            )
            assert bridge.stop(signal.SIGTERM, within=30) == 0
            done = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"
            applied_before = scalar(conn, done)
            held = JOBS - applied_before
            # Every other answer is stored and acknowledged by the stream, and applied by
            # no one.
            await wait_for(
                lambda: stream_messages(cluster) == held,
                60,
                lambda: f"{held} answers in the stream, not {stream_messages(cluster)}",
            )
            assert held > JOBS // 2, f"only {held} answers left for the stream to keep"
            for index in range(cluster.size):
                cluster.kill(index)
            for node in cluster.nodes:
                node.start(30)
            cluster.wait_formed(60)
            await wait_for(
                lambda: stream_messages(cluster) is not None, 60, "the stream has a leader"
            )
            kept = stream_messages(cluster)
            await start_bridge(stack, cluster, **env)
            await wait_for(
                lambda: scalar(conn, LIVE) == 0,
                REPLY_DEADLINE + 60,
                lambda: f"no job left waiting ({scalar(conn, LIVE)} are)",
            )
            outcomes = conn.execute(OUTCOMES).fetchall()
        by_status = {(r["status"], r["retryable"]): r["n"] for r in outcomes}
        print(
            f"\nall 3 nodes killed (sync_interval {cluster.sync_interval or 'default'}): "
            f"{held} answers held by the stream, {kept} kept after the restart; "
            f"outcomes {by_status}"
        )
        # Final: done, or timed out by the sweep and retryable. Never stuck, never lost
        # for good.
        assert set(by_status) <= {("done", False), ("timeout", True)}, by_status
        assert sum(by_status.values()) == JOBS
        if cluster.sync_interval == "always":
            assert kept == held
            assert by_status == {("done", False): JOBS}
    finally:
        stack.stop_all(within=None)
