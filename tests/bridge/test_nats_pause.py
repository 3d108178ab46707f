"""A nats-server paused for longer than a confirmation's wait (SIGSTOP, then SIGCONT:
a stalled host, a long GC pause) while the publisher waits for its PONG. nats-py leaves
that PING's future in its queue when the wait times out, and the late PONG then ends
its read loop without a word: the connection goes on saying connected, sends, and
receives nothing again. The bridge starts its connection over after a PING that got no
answer, so answers reach it again."""

from __future__ import annotations

import os
import signal

import pytest

from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.services import instant_service
from arm_core.devtools.testbed.sql import dict_conn, job, scalar, upload
from tests.support.bridge import fast_settings, running_bridge

pytestmark = pytest.mark.integration


async def test_a_bridge_hears_again_after_nats_was_paused_through_a_confirmation(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    service = await instant_service(nats_server.url())
    try:
        async with running_bridge(fast_settings(db_url, nats_server.url())) as bridge:
            with dict_conn(db_url) as conn:
                before = upload(conn)
                await wait_for(lambda: job(conn, before.job_id)["status"] == "done", 20, "done")
                pid = nats_server.pid
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                try:
                    during = upload(conn)  # the publisher sends it and waits for a PONG
                    failed = bridge.publisher.counts["failed_batches"]
                    await wait_for(
                        lambda: bridge.publisher.counts["failed_batches"] > failed,
                        30,
                        "the publisher's confirmation timed out",
                    )
                finally:
                    os.kill(pid, signal.SIGCONT)
                after = upload(conn)
                done = (
                    "SELECT count(*) FROM arm.recognition_job "
                    "WHERE status = 'done' AND id = ANY(%s)"
                )
                await wait_for(
                    lambda: scalar(conn, done, ([during.job_id, after.job_id],)) == 2,
                    60,
                    "both done after the pause: the bridge hears answers again",
                )
    finally:
        await service.client.close()
