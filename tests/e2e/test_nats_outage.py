"""nats-server stopped for 3 s in the middle of a burst, with the real core and the real
reference service: the answers the service made while NATS was gone
wait in its queue and are sent after the reconnect, so every job ends `done` — no
result lost, none applied twice, each job processed once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import Stack, log_lines
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.sql import dict_conn, scalar, upload

pytestmark = pytest.mark.e2e

OUTAGE_SECONDS = 3  # the fault injected: how long nats-server stays stopped


@pytest.fixture
async def proxy(stack: Stack) -> AsyncIterator[TcpProxy]:
    assert stack.nats.port is not None
    tcp = await TcpProxy(stack.nats.port).start()
    try:
        yield tcp
    finally:
        await tcp.close()


def counts(db_url: str) -> dict[str, int]:
    with dict_conn(db_url) as conn:
        rows = conn.execute(
            "SELECT status::text AS status, count(*) AS n FROM arm.recognition_job GROUP BY 1"
        ).fetchall()
    return {r["status"]: r["n"] for r in rows}


async def test_nats_stopped_mid_burst_every_answer_of_the_service_arrives(
    stack: Stack, proxy: TcpProxy
) -> None:
    n = 400
    port = free_port()
    # ACK_TIMEOUT_SECONDS as in production rather than the stack's 1 s: this test is not
    # about a service that never acks, and a loaded machine must not dead-letter a job
    # whose ack is on its way.
    # Unpaced: the whole burst is in the service's hands when NATS stops.
    env = {"DEBUG": "true", "OUTBOX_BATCH_SIZE": 50, "ACK_TIMEOUT_SECONDS": 10, "PACING": "off"}
    bridge = stack.start("bridge", BRIDGE_HEALTH_PORT=port, **env)
    bridge.wait_healthy(port)
    # The service reaches nats-server through `proxy`, so the test can let it back in
    # only after the core has resubscribed: an answer published while no core instance
    # is subscribed is lost in core NATS (that is parts 1 and 2 of the issue, not this).
    # Its results come 2 s after its acks, so those of the jobs acked when NATS stops
    # are made during the outage.
    ref = stack.reference(
        NATS_URL=f"nats://127.0.0.1:{proxy.port}", REFERENCE_DELAY_SECONDS=2, DEBUG="true"
    )
    with dict_conn(stack.db_url) as conn:
        for _ in range(n):
            upload(conn)

    # Stopped once the service has acked 100: their results are still 2 s away.
    await wait_for(lambda: len(log_lines(ref.log(), action="ref_ack")) >= 100, 60, "100 acked")
    stack.nats.stop()
    proxy.block()
    await asyncio.sleep(OUTAGE_SECONDS)  # the outage itself, not a wait for a condition
    stack.nats.start()  # the same port
    await wait_for(lambda: (bridge.health(port) or {}).get("nats") == "ok", 60, "core reconnected")
    proxy.unblock()

    await wait_for(
        lambda: counts(stack.db_url) == {"done": n}, 180, lambda: str(counts(stack.db_url))
    )
    log = ref.log()
    assert log_lines(log, action="ref_waiting"), log[-5000:]  # the service did hold answers ...
    assert log_lines(log, action="ref_resumed")  # ... and sent them after the reconnect
    assert not log_lines(log, action="ref_pending_drop")
    assert len(log_lines(log, action="ref_result")) == n  # each job processed once
    with dict_conn(stack.db_url) as conn:
        results = "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
        assert scalar(conn, results) == n  # each result applied once
