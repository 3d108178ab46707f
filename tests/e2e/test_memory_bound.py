"""The bridge's memory is bounded by bytes while its database is away.

A real `arm-core bridge` whose PostgreSQL is cut off (a proxy that refuses it), and a
flood of 100 valid answers of about 0.9 MiB each, nearly three times INBOX_BUFFER_BYTES —
`metrics` is free-form, and this one is the costly shape to parse (a hundred thousand
small objects). The peak RSS the kernel
recorded for the process (VmHWM) stays within INBOX_BUFFER_BYTES' bound of its RSS before
the flood. Without RESULTS_STREAM what did not fit is dropped, counted and logged once
for the burst. With it the bridge pauses once it finds the database unreachable:
it hands back what it fetched (unacked) and fetches no more, and once the database is
back every answer is applied: nothing lost."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from arm_core.devtools.embedded import free_port
from arm_core.devtools.embedded_nats import EmbeddedNats
from arm_core.devtools.embedded_postgres import EmbeddedPostgres
from arm_core.devtools.testbed.faults import count, metric
from arm_core.devtools.testbed.polling import wait_for
from arm_core.devtools.testbed.processes import ArmProcess, log_lines
from arm_core.devtools.testbed.proxies import TcpProxy
from arm_core.devtools.testbed.services import envelope, nats_client
from arm_core.devtools.testbed.sql import dict_conn, publish, upload_many

pytestmark = pytest.mark.e2e

# Enough to overflow the buffer nearly three times over. (Scaling the buffer down with
# the flood does not keep the ratio: parsing one such answer alone takes tens of MiB.)
ANSWERS = 100
BUFFER_BYTES = 32 << 20  # INBOX_BUFFER_BYTES' default
# What the process may add to its RSS before the flood, at most: the buffer's envelopes
# (their rows, as compact text), the messages kept until acked with RESULTS_STREAM,
# nats-py's bounded queues, and one message parsed at a time.
BOUND = 4 * BUFFER_BYTES
DONE = "SELECT count(*) FROM arm.recognition_job WHERE status = 'done'"


def kib(pid: int, field: str) -> int:
    """A size from /proc/<pid>/status (VmRSS, VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def big_metrics() -> dict[str, Any]:
    """About 0.9 MiB of JSON that parses into ~115,000 dicts."""
    return {"cells": [{"r": 1} for _ in range(115_000)]}


def handled(port: int) -> float:
    """Answers the bridge has taken in: held (not applied) or dropped."""
    dropped = metric(port, 'arm_inbox_envelopes_total{outcome="dropped"}')
    return metric(port, "arm_inbox_buffered") + dropped


def taken_in(port: int, n: int) -> Callable[[], bool]:
    def taken() -> bool:
        try:
            return handled(port) >= n
        except TimeoutError:
            # A scrape the bridge answered late (its loop parsing a 0.9 MiB answer on a
            # loaded machine): not yet, ask again; the wait's own deadline decides.
            return False

    return taken


def holds_none_of_the_streams(port: int) -> Callable[[], bool]:
    """Whether the bridge holds no message of the stream (it handed them all back): what
    it may still hold came by core NATS, replayed when a reconnect looked like a new
    stream leader (on a loaded machine the server cut the flood's connection as a slow
    consumer), and no NAK can give that back."""

    def none() -> bool:
        try:
            held = metric(port, "arm_inbox_buffered")
            return held <= metric(port, "arm_inbox_replayed_total")
        except TimeoutError:
            return False  # a late scrape, as in taken_in

    return none


@pytest.mark.parametrize("stream", [False, True], ids=["core-nats", "results-stream"])
async def test_a_flood_of_large_answers_while_the_database_is_away_stays_within_the_bound(
    stream: bool,
    db_url: str,
    pg_server: EmbeddedPostgres,
    js_server: EmbeddedNats,
    tmp_path: Path,
) -> None:
    with dict_conn(db_url) as conn:
        upload_many(conn, ANSWERS)
        assert len(publish(conn, limit=ANSWERS)) == ANSWERS
        jobs = conn.execute("SELECT id AS job_id, file_id FROM arm.recognition_job").fetchall()
    assert pg_server.port is not None
    proxy = await TcpProxy(pg_server.port).start()
    proxied = db_url.replace(f":{pg_server.port}/", f":{proxy.port}/")
    port = free_port()
    env = {
        "DATABASE_URL": proxied,
        "NATS_URL": js_server.url(),
        "BRIDGE_HEALTH_PORT": str(port),
        "OUTBOX_POLL_SECONDS": "0.2",
        "SCHEDULE_TICK_SECONDS": "0.2",
        # The flood is results alone, no acks: with the default ack timeout (30 s, three
        # republishes) the jobs were dead-lettered while the database was away and their
        # large answers were still being applied, and the answers then came too late.
        "ACK_TIMEOUT_SECONDS": "3600",
        **({"RESULTS_STREAM": "RESULTS"} if stream else {}),
    }
    # Off the event loop, which serves the proxy: ArmProcess connects through it.
    bridge = await asyncio.to_thread(ArmProcess, "bridge", env, tmp_path / "bridge.log")
    client = await nats_client(js_server.url())
    try:
        await asyncio.to_thread(bridge.wait_healthy, port, 30)
        before = kib(bridge.proc.pid, "VmRSS")
        proxy.block()
        metrics = big_metrics()
        for n, row in enumerate(jobs, 1):
            body = envelope(row["job_id"], row["file_id"], "done", metrics=metrics)
            data = json.dumps(body, separators=(",", ":")).encode()
            assert 0.8 * (1 << 20) < len(data) < (1 << 20)
            await client.publish(
                "files.tabular_parsed", data, headers={"Nats-Msg-Id": f"r:{uuid.uuid4()}"}
            )
            if not stream and n % 20 == 0:
                # As fast as the bridge takes them in: faster, and nats-server itself
                # would drop them (a slow consumer to the server: core NATS' own limit).
                await wait_for(taken_in(port, n), 60, lambda: f"{handled(port)}")
        await client.flush(timeout=30)
        if stream:  # it pauses: nacks what it fetched, fetches no more
            await wait_for(
                lambda: metric(port, "arm_inbox_handed_back_total") >= 1, 60, "handed back"
            )
            await wait_for(holds_none_of_the_streams(port), 120, "holds none of the stream's")
        peak = kib(bridge.proc.pid, "VmHWM")
        grew = (peak - before) * 1024
        print(
            f"\nFIGURE RSS {'with' if stream else 'without'} RESULTS_STREAM: "
            f"{before / 1024:.0f} MiB before, peak {peak / 1024:.0f} MiB under "
            f"{ANSWERS} answers of ~0.9 MiB (+{grew / (1 << 20):.0f} MiB; bound "
            f"+{BOUND >> 20} MiB)"
        )
        assert grew <= BOUND
        proxy.unblock()
        if stream:  # every answer the stream kept is applied: nothing lost
            # About 2.4 such answers a second are applied here (40 s for the 100; a run
            # under load takes longer); the reply deadline is 600 s away.
            await wait_for(lambda: count(db_url, DONE) == ANSWERS, 300, "all applied")
        else:
            await wait_for(lambda: count(db_url, DONE) >= 1, 60, "the buffered applied")
    finally:
        await client.close()
        await asyncio.to_thread(bridge.stop)
        await proxy.close()
    log = bridge.log()
    drops = log_lines(log, action="inbox_drops", state="started", reason="buffer_full")
    if stream:
        assert not log_lines(log, action="inbox_drops"), "nothing of the stream's is dropped"
        assert not log_lines(log, reason="apply_error")
    else:
        assert count(db_url, DONE) < ANSWERS  # what did not fit was dropped
        assert len(drops) == 1, drops  # one line for the burst, not one per answer
