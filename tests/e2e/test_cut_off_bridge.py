"""A bridge cut off from its database pauses.

Two `arm-core bridge` processes with RESULTS_STREAM share one durable consumer; the
reference services answer through JetStream publish. Bridge A reaches PostgreSQL through
a proxy whose port then drops every packet (iptables): A's side finds out only by TCP's
own deadlines (tcp_user_timeout, 30 s), the server's side stays open, and A's NATS side
stays up. A must not sit on the answers it pulls: once its database fails it hands back
every message of the stream it holds (a NAK: B gets them 2 s later), fetches no more, and
probes its database. The session A left in a transaction is ended by the server
(idle_in_transaction_session_timeout). The re-acks of the requests B republishes are
stored by the stream (its duplicate window is shorter than the ack timeout).

Judged by the history: 60 s after the cut every job is done, none dlq or timeout, each
result applied once, and no session of the bridges idles in a transaction."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from arm_core.config import STREAM_ACK_WAIT_SECONDS as ACK_WAIT
from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.faults import black_hole, by_status, count, iptables_missing, metric
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import (
    ArmProcess,
    Stack,
    listening,
    log_lines,
    running_stack,
)
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.sql import dict_conn, scalar
from tests.support.flow import Flow, applied_results

pytestmark = pytest.mark.e2e

STREAM = "ARM_RESULTS"
LIVE_STATUS = "status IN ('queued', 'published', 'processing')"
LIVE = f"SELECT count(*) FROM arm.recognition_job WHERE {LIVE_STATUS}"
RESULTS = "SELECT count(*) FROM arm.s3_object WHERE bucket_role = 'results'"
# The sessions of the bridges' login idling in a transaction for longer than the
# server's timeout (20 s) and a margin: none may, once it has ended them.
IDLE_IN_TRANSACTION = (
    "SELECT count(*) FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%' "
    "AND usename = 'bridge_login' AND state_change < now() - interval '25 seconds'"
)


@pytest.fixture
def js_stack(db_url: str, tmp_path: Path) -> Iterator[Stack]:
    yield from running_stack(db_url, tmp_path, ["-js", "-sd", str(tmp_path / "js")])


@dataclass
class Pair:
    """Bridge A behind a proxy to PostgreSQL (health on `port`), bridge B direct, both on
    the results stream, and the reference services answering through JetStream."""

    proxy: TcpProxy
    a: ArmProcess
    b: ArmProcess
    port: int


async def pair(js_stack: Stack, db_url: str, pg_server: EmbeddedPostgres) -> Pair:
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    proxied = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    env = {
        "RESULTS_STREAM": STREAM,
        "ACK_TIMEOUT_SECONDS": "10",
        "DEBUG": "true",  # a line per result applied: each must be applied once
        # Unpaced: answers for every live job on their way to both bridges when the
        # database goes; paced from the floor, one job was in flight and 22 queued.
        "PACING": "off",
    }
    b = js_stack.bridge(**env)
    # A connects through the proxy this event loop serves: made and waited for off it.
    port = free_port()
    a = await asyncio.to_thread(
        js_stack.start, "bridge", BRIDGE_HEALTH_PORT=port, DATABASE_URL=proxied, **env
    )
    await asyncio.to_thread(a.wait_healthy, port)
    await listening(js_stack.reference(REFERENCE_DELAY_SECONDS="0.2"))
    return Pair(proxy, a, b, port)


def story(conn: Any, both: Pair) -> str:
    """What the bridges' logs say about the jobs still live, and A's pause."""
    live = [
        str(r["id"])
        for r in conn.execute(f"SELECT id FROM arm.recognition_job WHERE {LIVE_STATUS}")
    ]
    told = []
    for name, proc in (("A", both.a), ("B", both.b)):
        for line in proc.log().splitlines():
            if any(job in line for job in live) or "stream_" in line or "db_outage" in line:
                told.append(f"{name}: {line[:400]}")
    return "\n".join(told[-80:])


async def test_a_bridge_cut_off_from_its_database_pauses_and_nothing_is_left_undone(
    js_stack: Stack, db_url: str, pg_server: EmbeddedPostgres
) -> None:
    if missing := iptables_missing():
        pytest.skip(missing)
    both = await pair(js_stack, db_url, pg_server)
    proxy, a, b = both.proxy, both.a, both.b
    try:
        with Flow(db_url, per_step=5, pause=0.1) as flow, dict_conn(db_url) as conn:
            await wait_for(lambda: bool(applied_results([a.log()])), 60, "A applies its share")
            with black_hole(proxy.port):
                cut = time.monotonic()
                await wait_for(
                    lambda: bool(log_lines(a.log(), action="stream_intake", state="paused")),
                    60,
                    lambda: f"A pausing: {a.log()[-3000:]}",
                )
                paused_after = time.monotonic() - cut
                await wait_for(lambda: time.monotonic() - cut > 20, 30, "more flow after")
                n = flow.stop()
                await wait_for(
                    lambda: scalar(conn, LIVE) == 0,
                    max(1.0, 60 - (time.monotonic() - cut)),
                    lambda: f"nothing left undone 60 s after the cut: {by_status(db_url)}",
                )
                undone_in = time.monotonic() - cut
                assert scalar(conn, IDLE_IN_TRANSACTION) == 0
            statuses = by_status(db_url)
    finally:
        await proxy.close()
    assert statuses == {"done": n}, statuses
    # Each result registered once. (A batch A sent just before the cut may have
    # committed without A hearing back: applied, and in no log; never twice.)
    assert count(db_url, RESULTS) == n
    applied = applied_results([a.log(), b.log()])
    assert len(applied) <= n and set(applied.values()) == {1}
    handed_back = sum(
        int(line.split(" count=")[1].split()[0])
        for line in log_lines(a.log(), action="stream_hand_back")
    )
    print(
        f"\nFIGURE bridge cut off from its database: {n} jobs, A paused "
        f"{paused_after:.1f} s after the cut (handed back {handed_back}), nothing "
        f"undone {undone_in:.1f} s after it"
    )
    for proc in (a, b):
        assert proc.proc.poll() is None, proc.log()[-2000:]  # both still running


async def test_what_a_bridge_hands_back_reaches_the_other_at_once(
    js_stack: Stack, db_url: str, pg_server: EmbeddedPostgres
) -> None:
    """The hand-back is a NAK: what A held goes to B within seconds, not when the stream's
    ack_wait (30 s) of A's delivery runs out. A DBA's lock on the live jobs makes the
    answers wait, unacknowledged, in the bridges' buffers; A's database then refuses it
    (the proxy closes and refuses connections) just after A took answers in, A hands
    them back, the lock goes, and every job is done well inside that ack_wait."""
    both = await pair(js_stack, db_url, pg_server)
    a = both.a
    try:
        with Flow(db_url, per_step=5, pause=0.1) as flow, dict_conn(db_url) as conn:
            await wait_for(lambda: bool(applied_results([a.log()])), 60, "A applies its share")
            n = flow.stop()
            with dict_conn(db_url) as dba:
                dba.execute("BEGIN")
                dba.execute(f"SELECT id FROM arm.recognition_job WHERE {LIVE_STATUS} FOR UPDATE")
                # Off the event loop, which serves A's proxy: A's /metrics reads through it.
                held = partial(metric, both.port, "arm_inbox_buffered")
                await wait_for(
                    lambda: asyncio.to_thread(lambda: held() > 0),
                    60,
                    lambda: f"A holding answers: {by_status(db_url)}\n{a.log()[-3000:]}",
                )
                both.proxy.block()  # A took them in less than a second ago
                refused = time.monotonic()
                await wait_for(
                    lambda: bool(log_lines(a.log(), action="stream_hand_back")),
                    ACK_WAIT,
                    lambda: f"A handing back: {a.log()[-3000:]}",
                )
                handed_back = time.monotonic() - refused
                dba.execute("ROLLBACK")
            await wait_for(
                lambda: scalar(conn, LIVE) == 0,
                max(1.0, ACK_WAIT - 5 - (time.monotonic() - refused)),
                lambda: (
                    f"every job done before A's deliveries expire: {by_status(db_url)}\n"
                    + story(conn, both)
                ),
            )
            done_in = time.monotonic() - refused
    finally:
        await both.proxy.close()
    assert by_status(db_url) == {"done": n}
    print(
        f"\nFIGURE hand-back: A's database refused, A handed back {handed_back:.1f} s "
        f"later, every job done {done_in:.1f} s after the refusal (ack_wait {ACK_WAIT:g} s)"
    )
