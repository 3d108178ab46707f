"""Two bridges are the production shape, and a rolling restart of them
under a steady flow of uploads loses nothing. SIGTERM bridge A, start it again, then the
same for bridge B: every job ends `done`, every result applied exactly once, each
stopped bridge exits 0 having dropped no envelope at shutdown."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from nats.aio.client import Client

from arm_core.bridge.nats_client import confirm
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, Stack, log_lines, running_stack
from arm_core.devtools.testbed.services import envelope, instant_service
from arm_core.devtools.testbed.sql import Conn, dict_conn, publish, scalar, upload_many
from tests.support.bridge import fast_settings, running_bridge
from tests.support.flow import DONE, Flow, applied_results

pytestmark = pytest.mark.e2e

# DEBUG: one log line per envelope applied, counted per job below. The reply deadline is
# long, so a lost answer shows as a job left `processing`, never as a quiet `timeout`.
BRIDGE_ENV = {
    "DEBUG": "true",
    "OUTBOX_BATCH_SIZE": 50,
    "TABULAR_REPLY_TIMEOUT_SECONDS": 600,
    # Nothing here is lost on its way to the service (a stopping bridge confirms the batch
    # it publishes), so no job needs a republish. With the stack's 1 s ack timeout a
    # loaded machine, whose acks came back through the stream in more than a second, sent
    # thousands of republishes, which loaded it further, and dead-lettered the flow
    # (NO_ACK) until no job reached `done`.
    "ACK_TIMEOUT_SECONDS": 30,
    # Small inbox batches and buffers: under the flow, messages wait in nats-py's queue
    # in front of the inbox, which is what a careless shutdown would throw away.
    "INBOX_BATCH_SIZE": 4,
    "INBOX_BUFFER_SIZE": 8,
}


async def done_reaches(conn: Conn, count: int, what: str) -> None:
    await wait_for(lambda: scalar(conn, DONE) >= count, 60, what)


@pytest.fixture(params=["core", "results_stream"])
def either_stack(
    request: pytest.FixtureRequest, db_url: str, tmp_path: Path
) -> Iterator[tuple[Stack, bool]]:
    """The stack, its nats-server with JetStream for the RESULTS_STREAM variant (True)."""
    js = request.param == "results_stream"
    args = ["-js", "-sd", str(tmp_path / "js")] if js else []
    for stack in running_stack(db_url, tmp_path, args):
        yield stack, js


async def test_rolling_restart_of_two_bridges_under_a_steady_flow(
    either_stack: tuple[Stack, bool],
) -> None:
    """Both ways of receiving answers: a core NATS queue group (the stopping bridge
    drains its subscription), and RESULTS_STREAM (what a stopping bridge has
    not acknowledged, the stream gives to the other)."""
    stack, js = either_stack
    env = {**BRIDGE_ENV, **({"RESULTS_STREAM": "ARM_RESULTS"} if js else {})}
    service = await instant_service(stack.nats.url())
    done = DONE
    stopped: list[ArmProcess] = []
    codes: list[int] = []
    try:
        # Processes start and stop off the event loop: the reply service runs on it, and
        # a loop blocked for a bridge's start would let its 1 s ack timeouts run out.
        a = await asyncio.to_thread(stack.bridge, **env)
        b = await asyncio.to_thread(stack.bridge, **env)
        with Flow(stack.db_url) as flow, dict_conn(stack.db_url) as conn:
            for name in ("A", "B"):
                seen = scalar(conn, done)
                await done_reaches(conn, seen + 150, "flow running")
                old = a if name == "A" else b
                codes.append(await asyncio.to_thread(old.stop))  # SIGTERM mid-flow
                stopped.append(old)
                again = await asyncio.to_thread(stack.bridge, **env)
                if name == "A":
                    a = again
                else:
                    b = again
                # Counted from the restart: with the first 150 done while the old bridge
                # stopped and the new one started, the phase could end before the new
                # one heard a single answer (an idle CI machine did that).
                await done_reaches(conn, scalar(conn, done) + 150, "flow goes on")
            n = flow.stop()  # at least 600: the four phases above waited for them
        with dict_conn(stack.db_url) as conn:
            # No job stuck: every one reaches done (the deadline is generous, not timed).
            await wait_for(lambda: scalar(conn, done) == n, 120, lambda: f"{n} jobs done")
            total = scalar(conn, "SELECT count(*) FROM arm.recognition_job")
            with_result = scalar(
                conn, "SELECT count(*) FROM arm.recognition_job WHERE result_msg_id IS NOT NULL"
            )
            assert (total, with_result) == (n, n)
    finally:
        codes += [p.stop() for p in stack.procs if p.proc.poll() is None and p.command == "bridge"]
        await service.client.close()
    assert codes == [0, 0, 0, 0]
    logs = [p.log() for p in stack.procs]
    applied = applied_results(logs)
    assert len(applied) == n and set(applied.values()) == {1}  # each once, none twice
    for old in stopped:  # left the queue group after applying what it held; dropped none
        text = old.log()
        assert "bridge stopped" in text
        # With a core subscription it left the queue group by draining it; a stream's
        # consumer needs no leaving (what it has not acked goes to the other).
        assert js or log_lines(text, action="nats_drained")
        assert not log_lines(text, action="inbox_drop"), log_lines(text, action="inbox_drop")
    # Both bridges took a share in every phase (the queue group shares the answers).
    assert all(applied_results([p.log()]) for p in stack.procs)


async def test_sigterm_applies_every_envelope_received_before_leaving(
    db_url: str, nats_server: EmbeddedNats, client: Client
) -> None:
    """stop() while hundreds of answers wait in nats-py's queue in front of a held inbox
    (a DBA holds the jobs' rows: every batch is `busy`): the bridge leaves the queue group
    by draining, and every one of them is applied before it closes — none dropped. (With
    a plain unsubscribe, nats-py throws that queue away: this test then fails.)"""
    n = 300
    with dict_conn(db_url) as conn:
        upload_many(conn, n)
        assert len(publish(conn)) == n
        published = conn.execute("SELECT id AS job_id, file_id FROM arm.recognition_job").fetchall()
    settings = fast_settings(db_url, nats_server.url(), inbox_batch_size=4, inbox_buffer_size=8)
    async with running_bridge(settings) as bridge:
        sub = bridge.subscription
        assert sub is not None
        with psycopg.connect(db_url) as dba:
            dba.execute("SELECT id FROM arm.recognition_job FOR UPDATE")  # holds every row
            for row in published:
                ack = envelope(row["job_id"], row["file_id"], "processing")
                await client.publish(
                    "files.tabular_parsed",
                    json.dumps(ack).encode(),
                    headers={"Nats-Msg-Id": f"ack:{row['job_id']}:1"},
                )
            await confirm(client)
            # All n at the bridge: a few in the inbox's buffers, the rest in nats-py's queue.
            await wait_for(
                lambda: bridge.inbox.counts["received"] + sub.pending_msgs >= n,
                30,
                lambda: f"{bridge.inbox.counts['received']} + {sub.pending_msgs} of {n} received",
            )
            assert sub.pending_msgs > n // 2
            stopping = asyncio.create_task(bridge.stop(grace=60))
            # The publisher, listener and schedule runner have ended: the shutdown is under
            # way (a plain unsubscribe would have thrown the queue away by now).
            await wait_for(
                lambda: all(
                    s.ended() for s in (bridge.publisher, bridge.listener, bridge.scheduler)
                ),
                30,
                "the other tasks ended",
            )
            dba.rollback()  # the rows are free: the inbox can apply what it holds
        await asyncio.wait_for(stopping, 90)
        assert bridge.inbox.counts["received"] == n
        assert bridge.inbox.dropped() == 0, bridge.inbox.counts
        assert bridge.inbox.counts["applied"] == n
    with dict_conn(db_url) as conn:
        processing = "SELECT count(*) FROM arm.recognition_job WHERE status = 'processing'"
        assert scalar(conn, processing) == n
